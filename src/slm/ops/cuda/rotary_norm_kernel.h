#pragma once
// Launcher of the decode step's rotary embedding + per-head RMSNorm (src/slm/ops/cuda/rotary_norm_kernel.cu); plain
// C++ so the .cu needs no torch. The computation is ops::rotary_norm_step's (src/slm/ops/rotary_norm.h), which the
// CUDA test compares against the model's tensor ops and a float64 loop.
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// x and out [rows, heads, 2 * half] contiguous; positions [rows] int64; cos and sin [table_rows, half] in x's dtype;
// weight [2 * half] in x's dtype or null (no norm). half <= 512. stream: a cudaStream_t. Returns "" or the CUDA
// error text.
std::string rotary_norm(DecodeDtype dtype, const void* x, void* out, const int64_t* positions, const void* cos,
                        const void* sin, const void* weight, int64_t rows, int64_t heads, int64_t half, float eps,
                        void* stream);

}  // namespace slm::ops::cuda
