#pragma once
// The rotary embedding of one decode token followed by its per-head RMSNorm (attention's QK-norm), in one CUDA
// kernel (cuda/rotary_norm_kernel.cu): what model::Rope and RMSNorm compute with about ten tensor ops per tensor.
//   x [B, heads, dim] (dim = 2 * half; first and second halves are the (real, imaginary) pairs, as model::Rope);
//   positions [B] int64 on x's device, each row's position; cos, sin [rows >= max position + 1, half] in x's dtype
//   (model::Rope::tables); weight [dim] or undefined (rotation only). Returns [B, heads, dim] in x's dtype.
// The rotation rounds to x's dtype after each product and sum, as the tensor ops do (equal bit for bit); the norm
// reduces in FP32 like at::rms_norm.
#include <ATen/core/Tensor.h>

namespace slm::ops {

// Whether (with ops::fused_kernels_enabled()) rotary_norm_step runs here: a CUDA build, x on the GPU in FP32/BF16/FP16
// with tables and weight of its dtype, no gradient wanted, half <= 512.
bool rotary_norm_fusable(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& weight);

at::Tensor rotary_norm_step(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& weight, double eps);

// Training's form, for a whole block of tokens, differentiable in x and weight: x [B, T, heads, dim] (dim = 2 * half);
// positions ids [B or 1, T] int64 on x's device (each token's place in its packed document), or, with ids undefined,
// start + t in every row; cos, sin [rows, half] contiguous in x's dtype (model::Rope::tables; every position below
// rows); weight [dim] in FP32 or x's dtype, or undefined (rotation only). Returns [B, T, heads, dim] in x's dtype:
// rotate (rounded to x's dtype as model::Rope rounds), then, with a weight, r * rsqrt(mean(r^2) + eps) * weight in
// FP32. One kernel forward; backward one kernel for x's gradient and per-CTA partial sums of the weight's (a fixed
// grid, summed here: the same on every run). It keeps x (not the rotation) and recomputes the rotation backward.
// Whether (with ops::fused_kernels_enabled()) it runs here: a CUDA build, x on the GPU, contiguous, in FP32/BF16/FP16,
// 4-dim with an even last dim of at most 1024, weight undefined or [dim] in FP32 or x's dtype on x's device. Grad
// mode may be on or off.
bool rotary_norm_train_fusable(const at::Tensor& x, const at::Tensor& weight);
at::Tensor rotary_norm_train(const at::Tensor& x, const at::Tensor& ids, int64_t start, const at::Tensor& cos,
                             const at::Tensor& sin, const at::Tensor& weight, double eps);

}  // namespace slm::ops
