#pragma once
// Launcher of the fused Mamba-3 SISO decode step (src/slm/ops/cuda/mamba3_step_kernel.cu); plain C++ so the .cu needs
// no torch. The math is ops::mamba3_preprocess + ops::mamba3_step for one token (src/slm/ops/mamba3_scan.cpp), which
// the CUDA tests compare against in float64.
#include <string>

#include "slm/ops/mamba3_step_args.h"

namespace slm::ops::cuda {

// The step on the GPU (mamba3_step_args.h gives the layout): proj and the weights bf16 (`bf16`) or FP32; stream: a
// cudaStream_t. Returns "" or the CUDA error text.
std::string mamba3_step(const Mamba3StepShape& s, bool bf16, const Mamba3StepArgs& a, void* stream);

}  // namespace slm::ops::cuda
