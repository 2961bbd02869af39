#pragma once
// Launcher of the fused Sinkhorn projection (src/slm/ops/cuda/sinkhorn_kernel.cu); plain C++ so the .cu needs no
// torch. The math is model::sinkhorn's (src/slm/model/features/mhc.h), which the CUDA test compares against.
#include <cstdint>
#include <string>

namespace slm::ops::cuda {

constexpr int kSinkhornMaxStreams = 8;

// `matrices` n x n FP32 matrices of logits, contiguous, into out (same layout); 1 <= n <= kSinkhornMaxStreams.
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string sinkhorn(const float* logits, float* out, int64_t matrices, int n, int iters, float eps, void* stream);

}  // namespace slm::ops::cuda
