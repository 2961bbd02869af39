#include "slm/ops/residual_mix.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/torch.h>

#include <algorithm>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/ops/rms_norm.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/residual_mix_kernel.h"
#endif

namespace slm::ops {

#ifdef SLM_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Training's mix, an FP32 stream with y in its own type: one kernel forward, one backward (the tensor ops take four
// forward and about ten backward, with an FP32 copy of x + y kept for r's gradient; this keeps x and y themselves).
// Without a previous layer's output y is an empty tensor (autograd's custom functions take no undefined inputs).
class FusedResidualMix : public torch::autograd::Function<FusedResidualMix> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y, const at::Tensor& r,
                            const at::Tensor& x0, const at::Tensor& b) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = at::empty_like(x);
    const bool has_y = y.numel() > 0;
    const auto ydt = decode_dtype(y.scalar_type());
    const std::string err = cuda::residual_mix_train(ydt, x.data_ptr<float>(), has_y ? y.data_ptr() : nullptr,
                                                     r.data_ptr<float>(), x0.data_ptr<float>(), b.data_ptr<float>(),
                                                     out.data_ptr<float>(), x.numel(), current_stream(x));
    if (!err.empty()) throw Error("residual_mix: " + err);
    ctx->save_for_backward({x, y, r, x0, b});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1], &r = saved[2], &x0 = saved[3], &b = saved[4];
    const c10::cuda::CUDAGuard guard(x.device());
    const auto g = grads[0].to(at::kFloat).contiguous();
    const bool has_y = y.numel() > 0;
    auto gx = at::empty_like(x), gx0 = at::empty_like(x0);
    auto gy = has_y ? at::empty_like(y) : at::Tensor();
    auto partials = at::empty({cuda::residual_mix_backward_blocks(x.numel()), 2}, x.options());
    const auto ydt = decode_dtype(y.scalar_type());
    const std::string err = cuda::residual_mix_backward(
        ydt, g.data_ptr<float>(), x.data_ptr<float>(), has_y ? y.data_ptr() : nullptr, r.data_ptr<float>(),
        x0.data_ptr<float>(), b.data_ptr<float>(), gx.data_ptr<float>(), has_y ? gy.data_ptr() : nullptr,
        gx0.data_ptr<float>(), partials.data_ptr<float>(), x.numel(), current_stream(x));
    if (!err.empty()) throw Error("residual_mix backward: " + err);
    const auto sums = partials.sum(0);
    return {gx, gy, sums[0].reshape(r.sizes()), gx0, sums[1].reshape(b.sizes())};
  }
};

// The mix and the next layer's pre-norm in one kernel each way (residual_mix_norm). Outputs: the stream out (FP32)
// and the normed h (in the block's dtype). Saves x, y, x0, r, b, w, out and the rows' rstd: out is the next mix's x,
// so it is kept once.
class FusedResidualMixNorm : public torch::autograd::Function<FusedResidualMixNorm> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y, const at::Tensor& r,
                               const at::Tensor& x0, const at::Tensor& b, const at::Tensor& w, double eps,
                               at::ScalarType h_dtype) {
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t d = x.size(-1), rows = x.numel() / d;
    auto out = at::empty_like(x), h = at::empty(x.sizes(), x.options().dtype(h_dtype));
    auto rstd = at::empty({rows}, x.options());
    check_launch(cuda::residual_mix_norm_train(
        decode_dtype(h_dtype), x.data_ptr<float>(), y.numel() > 0 ? y.data_ptr() : nullptr, r.data_ptr<float>(),
        x0.data_ptr<float>(), b.data_ptr<float>(), w.data_ptr<float>(), static_cast<float>(eps), out.data_ptr<float>(),
        h.data_ptr(), rstd.data_ptr<float>(), rows, d, current_stream(x)));
    ctx->save_for_backward({x, y, r, x0, b, w, out});
    ctx->saved_data["rstd"] = rstd;
    return {out, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1], &r = saved[2], &x0 = saved[3], &b = saved[4], &w = saved[5],
               &out = saved[6];
    const auto rstd = ctx->saved_data["rstd"].toTensor();
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t d = x.size(-1), rows = x.numel() / d;
    const bool has_y = y.numel() > 0;
    const auto h_dtype = y.scalar_type();  // without y, the placeholder has the dtype of h
    const auto gout = grads[0].defined() ? grads[0].to(at::kFloat).contiguous() : at::Tensor();
    const auto gh = grads[1].defined() ? grads[1].to(h_dtype).contiguous() : at::Tensor();
    auto gx = at::empty_like(x), gx0 = at::empty_like(x0);
    auto gy = has_y ? at::empty_like(y) : at::Tensor();
    auto partials = at::empty({cuda::residual_mix_norm_backward_blocks(rows), d + 2}, x.options());
    check_launch(cuda::residual_mix_norm_backward(
        decode_dtype(h_dtype), gout.defined() ? gout.data_ptr<float>() : nullptr,
        gh.defined() ? gh.data_ptr() : nullptr, out.data_ptr<float>(), rstd.data_ptr<float>(), w.data_ptr<float>(),
        x.data_ptr<float>(), has_y ? y.data_ptr() : nullptr, r.data_ptr<float>(), x0.data_ptr<float>(),
        b.data_ptr<float>(), gx.data_ptr<float>(), has_y ? gy.data_ptr() : nullptr, gx0.data_ptr<float>(),
        partials.data_ptr<float>(), rows, d, current_stream(x)));
    const auto sums = partials.sum(0);
    return {gx, gy, sums[d].reshape(r.sizes()), gx0, sums[d + 1].reshape(b.sizes()), sums.narrow(0, 0, d), {}, {}};
  }
};

bool train_fusable(const at::Tensor& x, const at::Tensor& y, const at::Tensor& r, const at::Tensor& x0,
                   const at::Tensor& b) {
  auto fp32_on = [&](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat && t.device() == x.device() && t.is_contiguous();
  };
  return fused_kernels_enabled() && x.is_cuda() && x.numel() > 0 && fp32_on(x) && fp32_on(x0) &&
         x0.sizes() == x.sizes() && fp32_on(r) && fp32_on(b) && r.numel() == 1 && b.numel() == 1 &&
         (!y.defined() || (decode_dtype_supported(y.scalar_type()) && y.device() == x.device() &&
                           y.sizes() == x.sizes() && y.is_contiguous()));
}

}  // namespace
#endif

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
    const std::string err =
        cuda::residual_mix(dtype, xc.data_ptr(), yc.defined() ? yc.data_ptr() : nullptr, r.data_ptr(), x0c.data_ptr(),
                           b.data_ptr(), out.data_ptr(), xc.numel(), current_stream(x));
    if (!err.empty()) throw Error("residual_mix: " + err);
    return out;
  }
  if (grad && train_fusable(x, y, r, x0, b))
    return FusedResidualMix::apply(x, y.defined() ? y : at::empty({0}, x.options()), r, x0, b);
#endif
  return y.defined() ? r * (x + y) + b * x0 : r * x + b * x0;
}

std::pair<at::Tensor, at::Tensor> residual_mix_norm(const at::Tensor& x, const at::Tensor& y, const at::Tensor& r,
                                                    const at::Tensor& x0, const at::Tensor& b, const at::Tensor& w,
                                                    double eps) {
#ifdef SLM_WITH_CUDA
  const bool autocast = at::autocast::is_autocast_enabled(at::kCUDA);
  const auto h_dtype = autocast ? at::autocast::get_autocast_dtype(at::kCUDA) : at::kFloat;
  auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  if (train_fusable(x, y, r, x0, b) && x.dim() >= 1 && x.size(-1) % 4 == 0 && x.size(-1) <= cuda::kMaxMixNormWidth &&
      decode_dtype_supported(h_dtype) && (!y.defined() || y.scalar_type() == h_dtype) &&
      w.scalar_type() == at::kFloat && w.device() == x.device() && w.numel() == x.size(-1) && w.is_contiguous() &&
      aligned(x) && aligned(x0) && aligned(w)) {
    auto outs = FusedResidualMixNorm::apply(x, y.defined() ? y : at::empty({0}, x.options().dtype(h_dtype)), r, x0, b,
                                            w, eps, h_dtype);
    return {outs[0], outs[1]};
  }
#endif
  auto out = residual_mix(x, y, r, x0, b);
  return {out, rms_norm(out, w, eps)};
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
  const std::string err =
      cuda::stream_add_mean(decode_dtype(x.scalar_type()), x.data_ptr(), yc.data_ptr(), out.data_ptr(), mean.data_ptr(),
                            yc.numel() / std::max<int64_t>(d, 1), n, d, current_stream(x));
  if (!err.empty()) throw Error("stream_add_mean: " + err);
  return {out, mean};
#else
  throw Error("stream_add_mean: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
