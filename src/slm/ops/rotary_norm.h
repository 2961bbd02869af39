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

}  // namespace slm::ops
