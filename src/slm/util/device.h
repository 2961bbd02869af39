#pragma once
// The device a command runs on, from its --device flag.
#include <c10/core/Device.h>

#include <string>

namespace slm {

// "cpu", or "cuda" (the first GPU). Anything else, and "cuda" where libtorch sees no CUDA device (no CUDA in the
// build, or no GPU or driver on the machine), is an slm::Error saying so.
c10::Device parse_device(const std::string& name);

// Whether BF16 matrix products run natively on `device` (faster than FP32): CUDA GPUs (tensor cores), and CPUs with
// AMX-BF16 tiles, which oneDNN uses. Elsewhere libtorch's CPU BF16 GEMMs are emulated and many times slower than FP32
// (bench/RESULTS.md: 41x for Muon's batched products on an AVX2/AVX-512 EPYC), so code that would compute in BF16
// for speed computes in FP32 there. Decided from cpuinfo once per process.
bool native_bf16_matmul(c10::Device device);

}  // namespace slm
