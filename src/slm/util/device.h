#pragma once
// The device a command runs on, from its --device flag.
#include <c10/core/Device.h>

#include <string>

namespace slm {

// "cpu", or "cuda" (the first GPU). Anything else, and "cuda" where this libtorch has no CUDA or the machine shows no
// GPU, is an slm::Error that says which.
c10::Device parse_device(const std::string& name);

}  // namespace slm
