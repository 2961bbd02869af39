#pragma once
// Launcher of the residual-stream mix (src/slm/ops/cuda/residual_mix_kernel.cu); plain C++ so the .cu needs no torch.
// The computation is ops::residual_mix's (src/slm/ops/residual_mix.h).
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// out[i] = r * (x[i] + y[i]) + b * x0[i] over n contiguous elements of one dtype (y null: r * x[i] + b * x0[i]); r and
// b point at one element each (device memory, the same dtype), so a replayed CUDA graph reads their current values.
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string residual_mix(DecodeDtype dtype, const void* x, const void* y, const void* r, const void* x0, const void* b,
                         void* out, int64_t n, void* stream);

// out[r, i, j] = x[r, i, j] + y[r, j] for i < n (rounded to the dtype), mean[r, j] = (sum over i of out[r, i, j], in
// FP32) * (1/n in FP32), rounded; x, out [rows, n, d] and y, mean [rows, d] contiguous, one dtype.
std::string stream_add_mean(DecodeDtype dtype, const void* x, const void* y, void* out, void* mean, int64_t rows,
                            int64_t n, int64_t d, void* stream);

}  // namespace slm::ops::cuda
