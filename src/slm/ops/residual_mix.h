#pragma once
// The residual stream's per-layer mix, r * (x + y) + b * x0 with r and b 0-dim tensors (HybridLM's resid and x0
// lambdas) and y the previous layer's output (undefined: r * x + b * x0).
// Without a gradient, on CUDA, with everything in one dtype, one kernel (cuda/residual_mix_kernel.cu) that rounds as
// the tensor ops do and so equals them bit for bit; elsewhere those ops.
#include <ATen/core/Tensor.h>

namespace slm::ops {

at::Tensor residual_mix(const at::Tensor& x, const at::Tensor& y, const at::Tensor& r, const at::Tensor& x0,
                        const at::Tensor& b);

}  // namespace slm::ops
