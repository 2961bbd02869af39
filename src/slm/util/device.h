#pragma once
// The device a command runs on, from its --device flag.
#include <c10/core/Device.h>

#include <string>

namespace slm {

// "cpu", or "cuda" (the first GPU). Anything else, and "cuda" where libtorch sees no CUDA device (no CUDA in the
// build, or no GPU or driver on the machine), is an slm::Error saying so.
c10::Device parse_device(const std::string& name);

}  // namespace slm
