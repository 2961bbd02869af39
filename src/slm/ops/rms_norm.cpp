#include "slm/ops/rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>

#include "slm/util/error.h"

namespace slm::ops {

at::Tensor rms_norm_cpu_loop(const at::Tensor& x_in, const std::optional<at::Tensor>& weight, double eps) {
  if (!x_in.is_cpu() || x_in.scalar_type() != at::kFloat || x_in.dim() < 1)
    throw Error("rms_norm_cpu_loop: x must be a float32 CPU tensor with at least one dim");
  const int64_t d = x_in.size(-1);
  at::Tensor w;
  if (weight && weight->defined()) {
    if (!weight->is_cpu() || weight->scalar_type() != at::kFloat || weight->numel() != d)
      throw Error("rms_norm_cpu_loop: weight must be float32 [" + std::to_string(d) + "] on the CPU");
    w = weight->contiguous();
  }
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  if (d == 0 || x.numel() == 0) return y;
  const int64_t rows = x.numel() / d;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.defined() ? w.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Rows of a decode step are few: a thread per row would cost more than the row; large inputs split.
  at::parallel_for(0, rows, std::max<int64_t>(1, 65536 / d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * d;
      float* yr = yp + r * d;
      // Eight partial sums: the compiler vectorizes them without reassociating a single float sum.
      float part[8] = {};
      int64_t i = 0;
      for (; i + 8 <= d; i += 8)
        for (int k = 0; k < 8; ++k) part[k] += xr[i + k] * xr[i + k];
      double ss = 0;
      for (int k = 0; k < 8; ++k) ss += part[k];
      for (; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      if (wp)
        for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * inv * wp[j];
      else
        for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * inv;
    }
  });
  return y;
}

at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  const bool has_w = weight && weight->defined();
  const bool needs_grad = at::GradMode::is_enabled() && (x.requires_grad() || (has_w && weight->requires_grad()));
  if (!needs_grad && x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 &&
      (!has_w || (weight->is_cpu() && weight->scalar_type() == at::kFloat)))
    return rms_norm_cpu_loop(x, weight, eps);
  // Under BF16 autocast a QK-norm gets a BF16 input and its FP32 weight: mixed dtypes send at::rms_norm to its
  // composite of about a dozen kernels forward and backward (cast, pow, mean, rsqrt, muls). With the weight in the
  // input's type it runs the fused kernel pair, which computes in FP32 inside; the weight's gradient comes back to
  // FP32 through the cast.
  if (has_w && x.is_cuda() && weight->scalar_type() != x.scalar_type() &&
      (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf))
    return at::rms_norm(x, {x.size(-1)}, weight->to(x.scalar_type()), eps);
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

}  // namespace slm::ops
