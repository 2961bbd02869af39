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

// Training's form (ops::rotary_norm_train): every token of a [B, T, heads, 2 * half] block, forward and backward.
struct RotaryNormTrainArgs {
  DecodeDtype dtype;                   // x's, out's, the gradients' and the tables' element type
  int64_t batch, tokens, heads, half;  // x [batch, tokens, heads, 2 * half] contiguous; half <= 512, rows < 2^31
  const int64_t* ids;                  // [ids_rows (1 or batch), tokens] contiguous, the positions; null: start + t
  int64_t ids_rows, start;
  const void* cos;  // cos, sin [table_rows, half] contiguous; a position outside them gives NaN
  const void* sin;
  int64_t table_rows;
  const void* weight;  // [2 * half] in FP32 (weight_fp32) or in dtype; null: rotation only, no norm
  bool weight_fp32;
  float eps;
};

// out = norm(rotate(x)) in dtype (the rotation rounded as the tensor ops round it; the norm in FP32). stream: a
// cudaStream_t. Returns "" or the CUDA error text.
std::string rotary_norm_train_forward(const RotaryNormTrainArgs& a, const void* x, void* out, void* stream);
// The row count of rotary_norm_train_backward's partials: one per CTA of its fixed grid for tokens = B * T.
int64_t rotary_norm_train_backward_blocks(int64_t tokens);
// From grad_out (dtype, as out): grad_x in dtype and, when partials is not null (and a weight is given), partials
// [rotary_norm_train_backward_blocks(B * T)][2 * half] FP32 whose column sums are the weight's gradient.
// Recomputes the rotation and the norm's scale from x. Returns "" or the CUDA error text.
std::string rotary_norm_train_backward(const RotaryNormTrainArgs& a, const void* x, const void* grad_out, void* grad_x,
                                       float* partials, void* stream);

}  // namespace slm::ops::cuda
