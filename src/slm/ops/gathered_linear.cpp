#include "slm/ops/gathered_linear.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "slm/ops/cuda/gathered_linear_kernel.h"
#endif

namespace slm::ops {

bool gathered_linear_fusable(const at::Tensor& x, const at::Tensor& w) {
#ifdef SLM_WITH_CUDA
  const auto dt = x.scalar_type();
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad());
  return fused_kernels_enabled() && x.is_cuda() && !grad &&
         (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf) && w.scalar_type() == dt && w.dim() == 3 &&
         w.is_contiguous() && w.device() == x.device() && x.dim() == 2 && (w.size(2) * w.element_size()) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0;
#else
  (void)x, (void)w;
  return false;
#endif
}

at::Tensor gathered_linear(const at::Tensor& x_in, const at::Tensor& w, const at::Tensor& ids_in, int64_t x_div) {
  if (!gathered_linear_fusable(x_in, w))
    throw Error("gathered_linear: no fused kernel for x " + shape_text(x_in) + " and w " + shape_text(w) +
                " here (check gathered_linear_fusable)");
  if (x_in.size(1) != w.size(2))
    throw Error("gathered_linear: x " + shape_text(x_in) + " does not match the matrices' inputs " + shape_text(w));
  if (x_div < 1 || (ids_in.defined() &&
                    (ids_in.dim() != 1 || ids_in.device() != x_in.device() || ids_in.size(0) > x_in.size(0) * x_div)))
    throw Error("gathered_linear: ids must be [A] on x's device with A <= rows * x_div");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x_in.device());
  auto x = x_in.contiguous();
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) x = x.clone();  // rows are whole 16-byte runs from here
  const auto ids = ids_in.defined() ? ids_in.to(at::kLong).contiguous() : at::Tensor();
  const int64_t a = ids.defined() ? ids.size(0) : x.size(0) * x_div, out = w.size(1), in = w.size(2);
  auto y = at::empty({a, out}, x.options());
  const auto dtype = x.scalar_type() == at::kFloat      ? cuda::DecodeDtype::kFloat
                     : x.scalar_type() == at::kBFloat16 ? cuda::DecodeDtype::kBFloat16
                                                        : cuda::DecodeDtype::kHalf;
  const std::string err = cuda::gathered_linear(
      dtype, x.data_ptr(), w.data_ptr(), ids.defined() ? ids.data_ptr<int64_t>() : nullptr, y.data_ptr(), a, x_div, out,
      in, c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  if (!err.empty()) throw Error("gathered_linear: " + err);
  return y;
#else
  throw Error("gathered_linear: a CPU build has no fused kernel");
#endif
}

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w) {
  const int64_t in = x.size(-1), rows = in > 0 ? x.numel() / in : 0;
  if (rows < 1 || rows > kGemvMaxRows || w.dim() != 2 || w.size(1) != in) return at::linear(x, w);
  const auto flat = x.reshape({rows, in});
  const auto stacked = w.unsqueeze(0);
  if (!gathered_linear_fusable(flat, stacked)) return at::linear(x, w);
  auto shape = x.sizes().vec();
  shape.back() = w.size(0);
  return gathered_linear(flat, stacked, at::Tensor(), 1).view(shape);
}

}  // namespace slm::ops
