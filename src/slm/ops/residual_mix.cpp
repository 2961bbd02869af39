#include "slm/ops/residual_mix.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

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

}  // namespace slm::ops
