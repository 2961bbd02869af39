#include "slm/ops/rotary_norm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/torch.h>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

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
  const std::string err = cuda::rotary_norm(
      dtype, x.data_ptr(), out.data_ptr(), positions.data_ptr<int64_t>(), cos.data_ptr(), sin.data_ptr(),
      weight.defined() ? weight.data_ptr() : nullptr, b, heads, half, static_cast<float>(eps), current_stream(x));
  if (!err.empty()) throw Error("rotary_norm_step: " + err);
  return out;
#else
  (void)eps, (void)heads;
  throw Error("rotary_norm_step: a CPU build has no fused kernel");
#endif
}

#ifdef SLM_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cuda::RotaryNormTrainArgs train_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& ids,
                                     const at::Tensor& cos, const at::Tensor& sin, int64_t start, double eps) {
  cuda::RotaryNormTrainArgs a{};
  a.dtype = decode_dtype(x.scalar_type());
  a.batch = x.size(0), a.tokens = x.size(1), a.heads = x.size(2), a.half = x.size(3) / 2;
  a.ids = ids.numel() > 0 ? ids.data_ptr<int64_t>() : nullptr;
  a.ids_rows = ids.numel() > 0 ? ids.size(0) : 0;
  a.start = start;
  a.cos = cos.data_ptr(), a.sin = sin.data_ptr(), a.table_rows = cos.size(0);
  a.weight = weight.numel() > 0 ? weight.data_ptr() : nullptr;
  a.weight_fp32 = weight.scalar_type() == at::kFloat;
  a.eps = static_cast<float>(eps);
  return a;
}

// The rotation and QK-norm of training: one kernel forward, one backward (with the weight's partial sums), where the
// tensor ops take about twenty per tensor with their backward. Absent ids or weight come as empty tensors (a custom
// function takes no undefined inputs); x, weight, ids contiguous (rotary_norm_train sees to it).
class FusedRotaryNorm : public torch::autograd::Function<FusedRotaryNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& ids,
                            const at::Tensor& cos, const at::Tensor& sin, int64_t start, double eps) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = at::empty_like(x);
    const std::string err = cuda::rotary_norm_train_forward(train_args(x, weight, ids, cos, sin, start, eps),
                                                            x.data_ptr(), out.data_ptr(), current_stream(x));
    if (!err.empty()) throw Error("rotary_norm_train: " + err);
    ctx->save_for_backward({x, weight, ids, cos, sin});
    ctx->saved_data["start"] = start;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &ids = saved[2], &cos = saved[3], &sin = saved[4];
    const c10::cuda::CUDAGuard guard(x.device());
    const auto g = grads[0].to(x.scalar_type()).contiguous();
    auto gx = at::empty_like(x);
    // The weight's gradient only where it is wanted (needs_input_grad counts tensor inputs: x 0, weight 1).
    const bool want_w = weight.numel() > 0 && ctx->needs_input_grad(1);
    const int64_t dim = x.size(3);
    auto partials = want_w ? at::empty({cuda::rotary_norm_train_backward_blocks(x.size(0) * x.size(1)), dim},
                                       x.options().dtype(at::kFloat))
                           : at::Tensor();
    const std::string err = cuda::rotary_norm_train_backward(
        train_args(x, weight, ids, cos, sin, ctx->saved_data["start"].toInt(), ctx->saved_data["eps"].toDouble()),
        x.data_ptr(), g.data_ptr(), gx.data_ptr(), want_w ? partials.data_ptr<float>() : nullptr, current_stream(x));
    if (!err.empty()) throw Error("rotary_norm_train backward: " + err);
    const auto gw = want_w ? partials.sum(0).to(weight.scalar_type()).reshape(weight.sizes()) : at::Tensor();
    return {gx, gw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace
#endif

bool rotary_norm_train_fusable(const at::Tensor& x, const at::Tensor& weight) {
#ifdef SLM_WITH_CUDA
  const auto dt = x.scalar_type();
  if (!fused_kernels_enabled() || !x.is_cuda() || !decode_dtype_supported(dt) || x.dim() != 4 || !x.is_contiguous())
    return false;
  const int64_t dim = x.size(3);
  // Rows (b, t, head) below 2^31: the kernels index them in 32 bits.
  return dim % 2 == 0 && dim >= 2 && dim <= 1024 && x.numel() / dim < (int64_t{1} << 31) &&
         (!weight.defined() || ((weight.scalar_type() == at::kFloat || weight.scalar_type() == dt) &&
                                weight.numel() == dim && weight.device() == x.device()));
#else
  (void)x, (void)weight;
  return false;
#endif
}

at::Tensor rotary_norm_train(const at::Tensor& x, const at::Tensor& ids, int64_t start, const at::Tensor& cos,
                             const at::Tensor& sin, const at::Tensor& weight, double eps) {
  if (!rotary_norm_train_fusable(x, weight))
    throw Error("rotary_norm_train: no fused kernel for x " + shape_text(x) + " and weight " + shape_text(weight) +
                " here (check rotary_norm_train_fusable)");
  const int64_t b = x.size(0), t = x.size(1), half = x.size(3) / 2;
  if (ids.defined() && (ids.dim() != 2 || (ids.size(0) != 1 && ids.size(0) != b) || ids.size(1) != t ||
                        ids.scalar_type() != at::kLong || ids.device() != x.device()))
    throw Error("rotary_norm_train: ids must be int64 [1 or " + std::to_string(b) + ", " + std::to_string(t) +
                "] on x's device, got " + shape_text(ids));
  if (cos.dim() != 2 || cos.size(1) != half || !cos.is_contiguous() || cos.scalar_type() != x.scalar_type() ||
      cos.device() != x.device() || sin.sizes() != cos.sizes() || sin.scalar_type() != cos.scalar_type() ||
      !sin.is_contiguous() || sin.device() != x.device())
    throw Error("rotary_norm_train: cos and sin must be contiguous [rows, " + std::to_string(half) +
                "] in x's dtype on its device, got " + shape_text(cos) + " and " + shape_text(sin));
  if (!ids.defined() && (start < 0 || start + t > cos.size(0)))
    throw Error("rotary_norm_train: positions " + std::to_string(start) + ".." + std::to_string(start + t - 1) +
                " outside the tables' " + std::to_string(cos.size(0)) + " rows");
#ifdef SLM_WITH_CUDA
  // contiguous(): no copy for a projection's view or a parameter; a narrowed ids ([B, T] of a longer row) is copied.
  const auto none = at::empty({0}, x.options());
  return FusedRotaryNorm::apply(x.contiguous(), weight.defined() ? weight.contiguous() : none,
                                ids.defined() ? ids.contiguous() : at::empty({0}, x.options().dtype(at::kLong)), cos,
                                sin, start, eps);
#else
  (void)eps;
  throw Error("rotary_norm_train: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
