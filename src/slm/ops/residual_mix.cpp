#include "slm/ops/residual_mix.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "slm/ops/cuda/residual_mix_kernel.h"
#endif

namespace slm::ops {

at::Tensor residual_mix(const at::Tensor& x, const at::Tensor& y, const at::Tensor& r, const at::Tensor& x0,
                        const at::Tensor& b) {
#ifdef SLM_WITH_CUDA
  const auto dt = x.scalar_type();
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || (y.defined() && y.requires_grad()) ||
                                                   x0.requires_grad() || r.requires_grad() || b.requires_grad());
  if (fused_kernels_enabled() && x.is_cuda() && !grad && decode_dtype_supported(dt) && x0.scalar_type() == dt &&
      r.scalar_type() == dt && b.scalar_type() == dt && r.numel() == 1 && b.numel() == 1 && x0.sizes() == x.sizes() &&
      x0.device() == x.device() &&
      (!y.defined() || (y.scalar_type() == dt && y.sizes() == x.sizes() && y.device() == x.device())) &&
      r.device() == x.device() && b.device() == x.device()) {
    const c10::cuda::CUDAGuard guard(x.device());
    const auto xc = x.contiguous(), x0c = x0.contiguous(), yc = y.defined() ? y.contiguous() : at::Tensor();
    auto out = at::empty_like(xc);
    const auto dtype = decode_dtype(dt);
    const std::string err = cuda::residual_mix(dtype, xc.data_ptr(), yc.defined() ? yc.data_ptr() : nullptr,
                                               r.data_ptr(), x0c.data_ptr(), b.data_ptr(), out.data_ptr(), xc.numel(),
                                               c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
    if (!err.empty()) throw Error("residual_mix: " + err);
    return out;
  }
#endif
  return y.defined() ? r * (x + y) + b * x0 : r * x + b * x0;
}

bool stream_add_mean_fusable(const at::Tensor& streams, const at::Tensor& y) {
#ifdef SLM_WITH_CUDA
  const auto dt = streams.scalar_type();
  return fused_kernels_enabled() && streams.is_cuda() && decode_dtype_supported(dt) && y.scalar_type() == dt &&
         y.device() == streams.device() && streams.dim() == y.dim() + 1 && streams.dim() >= 2 &&
         streams.sizes().slice(0, y.dim() - 1) == y.sizes().slice(0, y.dim() - 1) && streams.size(-1) == y.size(-1) &&
         !(at::GradMode::is_enabled() && (streams.requires_grad() || y.requires_grad()));
#else
  (void)streams, (void)y;
  return false;
#endif
}

std::pair<at::Tensor, at::Tensor> stream_add_mean(const at::Tensor& streams, const at::Tensor& y) {
  if (!stream_add_mean_fusable(streams, y))
    throw Error("stream_add_mean: no fused kernel for these streams and block output (check stream_add_mean_fusable)");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(streams.device());
  const auto x = streams.contiguous(), yc = y.contiguous();
  auto out = at::empty_like(x), mean = at::empty_like(yc);
  const int64_t n = x.size(-2), d = x.size(-1);
  const std::string err = cuda::stream_add_mean(decode_dtype(x.scalar_type()), x.data_ptr(), yc.data_ptr(),
                                                out.data_ptr(), mean.data_ptr(), yc.numel() / std::max<int64_t>(d, 1),
                                                n, d, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  if (!err.empty()) throw Error("stream_add_mean: " + err);
  return {out, mean};
#else
  throw Error("stream_add_mean: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
