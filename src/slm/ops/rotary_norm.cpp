#include "slm/ops/rotary_norm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "slm/ops/cuda/rotary_norm_kernel.h"
#endif

namespace slm::ops {

bool rotary_norm_fusable(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& weight) {
#ifdef SLM_WITH_CUDA
  const auto dt = x.scalar_type();
  const int64_t half = x.dim() == 3 ? x.size(2) / 2 : 0;
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || (weight.defined() && weight.requires_grad()));
  return fused_kernels_enabled() && x.is_cuda() && !grad && decode_dtype_supported(dt) && cos.scalar_type() == dt &&
         (!weight.defined() || weight.scalar_type() == dt) && half >= 1 && half <= 512 && x.size(2) == 2 * half;
#else
  (void)x, (void)cos, (void)weight;
  return false;
#endif
}

at::Tensor rotary_norm_step(const at::Tensor& x_in, const at::Tensor& positions, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& weight, double eps) {
  if (!rotary_norm_fusable(x_in, cos, weight))
    throw Error("rotary_norm_step: no fused kernel for x " + shape_text(x_in) + " here (check rotary_norm_fusable)");
  const int64_t b = x_in.size(0), heads = x_in.size(1), half = x_in.size(2) / 2;
  if (positions.dim() != 1 || positions.size(0) != b || positions.scalar_type() != at::kLong ||
      positions.device() != x_in.device())
    throw Error("rotary_norm_step: positions must be int64 [B] on x's device");
  if (cos.dim() != 2 || cos.size(1) != half || !cos.is_contiguous() || sin.sizes() != cos.sizes() ||
      sin.scalar_type() != cos.scalar_type() || !sin.is_contiguous())
    throw Error("rotary_norm_step: cos and sin must be contiguous [rows, " + std::to_string(half) + "] alike");
  if (weight.defined() && (weight.numel() != 2 * half || !weight.is_contiguous()))
    throw Error("rotary_norm_step: the norm weight must be contiguous [" + std::to_string(2 * half) + "]");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous();
  auto out = at::empty_like(x);
  const auto dtype = decode_dtype(x.scalar_type());
  const std::string err =
      cuda::rotary_norm(dtype, x.data_ptr(), out.data_ptr(), positions.data_ptr<int64_t>(), cos.data_ptr(),
                        sin.data_ptr(), weight.defined() ? weight.data_ptr() : nullptr, b, heads, half,
                        static_cast<float>(eps), c10::cuda::getCurrentCUDAStream(x.device().index()).stream());
  if (!err.empty()) throw Error("rotary_norm_step: " + err);
  return out;
#else
  (void)eps, (void)heads;
  throw Error("rotary_norm_step: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
