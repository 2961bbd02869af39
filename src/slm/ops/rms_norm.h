#pragma once
// RMSNorm over the last dim: y = x · rsqrt(mean(x²) + eps) · weight (weight optional), as at::rms_norm.
// libtorch's CPU rms_norm is a composite of about a dozen operators (pow, mean, add, rsqrt, mul, dtype casts): about
// 27 us for one 512-wide row, 12% of a small specialist's decode step (bench/RESULTS.md, "The NVFP4 LM head, ...").
// Where nothing needs its gradient, a contiguous FP32 CPU input takes one loop instead; everything else (autograd,
// other dtypes, CUDA) goes to at::rms_norm; on CUDA a BF16/FP16 input with a weight of another type has the weight
// cast to the input's type, which keeps at::rms_norm on its fused kernels.
#include <ATen/core/Tensor.h>

#include <optional>

namespace slm::ops {

at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps);

// The loop itself, for tests: x FP32 CPU, weight absent or FP32 [x.size(-1)].
at::Tensor rms_norm_cpu_loop(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps);

}  // namespace slm::ops
