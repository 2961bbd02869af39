#include "slm/ops/m2rnn_scan.h"


#include <torch/torch.h>

#include <string>
#include <vector>

#include "slm/ops/fused_kernels.h"
#include "slm/util/autocast.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/m2rnn_scan_kernels.h"
#endif

namespace slm::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void expect_shape(const at::Tensor& t, std::vector<int64_t> shape, const char* what) {
  if (!t.defined() || t.sizes() != at::IntArrayRef(shape)) {
    at::Tensor want = at::empty(shape, at::TensorOptions().device(at::kMeta));
    throw Error(std::string("m2rnn: ") + what + " has shape " + shape_text(t) + ", expected " + shape_text(want));
  }
}

struct Update {
  at::Tensor h, z;  // H_t and Z_t = tanh(H_{t-1} W + k vᵀ)
};

// k [B, Nh, K], v [B, Nh, V], f [B, Nh], h_prev [B, Nh, K, V].
Update update(const at::Tensor& h_prev, const at::Tensor& k, const at::Tensor& v, const at::Tensor& f,
              const at::Tensor& w) {
  auto z = at::tanh(h_prev.matmul(w) + k.unsqueeze(-1) * v.unsqueeze(-2));
  auto fe = f.unsqueeze(-1).unsqueeze(-1);
  return {fe * h_prev + (1 - fe) * z, z};
}

// Hᵀ q: q [B, Nh, K] -> [B, Nh, V].
at::Tensor read(const at::Tensor& h, const at::Tensor& q) { return q.unsqueeze(-2).matmul(h).squeeze(-2); }

// The state token t starts from: H_{t-1}, or zero where keep [B, T] (0 at document starts) says so. Without
// documents keep is empty (autograd functions take no undefined tensors).
at::Tensor entering(const at::Tensor& h, const at::Tensor& keep, int64_t t) {
  return keep.numel() > 0 ? h * keep.select(1, t).view({-1, 1, 1, 1}) : h;
}

// y_t = H_tᵀ q_t over a whole sequence with checkpointed, clipped backpropagation through time.
class CheckpointedScan : public torch::autograd::Function<CheckpointedScan> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& f, const at::Tensor& w, const at::Tensor& h0, const at::Tensor& keep,
                               double clip, int64_t every) {
    const int64_t t_len = q.size(1);
    std::vector<at::Tensor> checkpoints, ys;
    ys.reserve(t_len);
    auto h = h0;
    for (int64_t t = 0; t < t_len; ++t) {
      if (t % every == 0) checkpoints.push_back(h);
      h = update(entering(h, keep, t), k.select(1, t), v.select(1, t), f.select(1, t), w).h;
      ys.push_back(read(h, q.select(1, t)));
    }
    ctx->save_for_backward({q, k, v, f, w, at::stack(checkpoints), keep});
    ctx->saved_data["clip"] = clip;
    ctx->saved_data["every"] = every;
    return {at::stack(ys, 1), h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &f = saved[3], &w = saved[4], &checkpoints = saved[5];
    const auto& keep = saved[6];
    const double clip = ctx->saved_data["clip"].toDouble();
    const int64_t every = ctx->saved_data["every"].toInt();
    const int64_t t_len = q.size(1);
    const auto& dy = grads[0];
    auto dh = grads[1].defined() ? grads[1] : at::zeros_like(checkpoints[0]);
    const auto w_t = w.transpose(-1, -2);
    std::vector<at::Tensor> dq(t_len), dk(t_len), dv(t_len), df(t_len);
    auto dw = at::zeros_like(w);
    for (int64_t c = checkpoints.size(0) - 1; c >= 0; --c) {
      const int64_t start = c * every, end = std::min(t_len, start + every);
      // hs[i] = H_{start+i-1}; prevs[i] = the state token start+i starts from (zero at a document start).
      std::vector<at::Tensor> hs = {checkpoints[c]}, prevs, zs;
      for (int64_t t = start; t < end; ++t) {
        prevs.push_back(entering(hs.back(), keep, t));
        auto u = update(prevs.back(), k.select(1, t), v.select(1, t), f.select(1, t), w);
        hs.push_back(u.h);
        zs.push_back(u.z);
      }
      for (int64_t t = end - 1; t >= start; --t) {
        const auto &h_t = hs[t - start + 1], &h_prev = prevs[t - start], &z = zs[t - start];
        const auto q_t = q.select(1, t), k_t = k.select(1, t), v_t = v.select(1, t);
        if (dy.defined()) {
          const auto dy_t = dy.select(1, t);
          dh = dh + q_t.unsqueeze(-1) * dy_t.unsqueeze(-2);
          dq[t] = h_t.matmul(dy_t.unsqueeze(-1)).squeeze(-1);
        } else {
          dq[t] = at::zeros_like(q_t);
        }
        if (clip > 0) dh = dh.clamp(-clip, clip);
        const auto fe = f.select(1, t).unsqueeze(-1).unsqueeze(-1);
        const auto du = (1 - fe) * dh * (1 - z * z);  // through the convex mix and the tanh
        dw = dw + h_prev.transpose(-1, -2).matmul(du).sum(0);
        dk[t] = du.matmul(v_t.unsqueeze(-1)).squeeze(-1);
        dv[t] = du.transpose(-1, -2).matmul(k_t.unsqueeze(-1)).squeeze(-1);
        df[t] = (dh * (h_prev - z)).sum({-2, -1});
        dh = entering(fe * dh + du.matmul(w_t), keep, t);
      }
    }
    return {at::stack(dq, 1), at::stack(dk, 1), at::stack(dv, 1), at::stack(df, 1), dw, dh, {}, {}, {}};
  }
};

#ifdef SLM_WITH_CUDA
cuda::M2rnnShape fused_shape(const at::Tensor& q, const at::Tensor& v, int64_t every) {
  return {q.size(0), q.size(1), q.size(2), q.size(3), v.size(3), every};
}

const float* ptr_or_null(const at::Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr<float>() : nullptr; }

// The same scan as CheckpointedScan through the fused kernels of ops/cuda/m2rnn_scan_kernels.cu, in FP32.
class FusedScan : public torch::autograd::Function<FusedScan> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& f, const at::Tensor& w, const at::Tensor& h0, const at::Tensor& keep,
                               double clip, int64_t every) {
    const c10::cuda::CUDAGuard guard(q.device());
    const auto s = fused_shape(q, v, every);
    const int64_t stretches = (s.tokens + every - 1) / every;
    // Inside forward grad mode is off, but the inputs still say whether a backward can follow.
    const bool training = q.requires_grad() || k.requires_grad() || v.requires_grad() || f.requires_grad() ||
                          w.requires_grad() || h0.requires_grad();
    auto y = at::empty({s.batch, s.tokens, s.heads, s.v_dim}, q.options());
    auto h_last = at::empty_like(h0);
    auto cps = training ? at::empty({stretches, s.batch, s.heads, s.k_dim, s.v_dim}, q.options()) : at::Tensor();
    check_launch(cuda::m2rnn_forward(s, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                     f.data_ptr<float>(), ptr_or_null(keep), w.data_ptr<float>(), h0.data_ptr<float>(),
                                     y.data_ptr<float>(), h_last.data_ptr<float>(),
                                     training ? cps.data_ptr<float>() : nullptr,
                                     current_stream(q)));
    if (training) ctx->save_for_backward({q, k, v, f, w, cps, keep});
    ctx->saved_data["clip"] = clip;
    ctx->saved_data["every"] = every;
    return {y, h_last};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &f = saved[3], &w = saved[4], &cps = saved[5];
    const auto& keep = saved[6];
    const c10::cuda::CUDAGuard guard(q.device());
    const auto s = fused_shape(q, v, ctx->saved_data["every"].toInt());
    const auto dy = grads[0].defined() ? grads[0].to(at::kFloat).contiguous() : at::Tensor();
    const auto dh_last = grads[1].defined() ? grads[1].to(at::kFloat).contiguous() : at::Tensor();
    auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v), df = at::empty_like(f);
    auto dw = at::zeros_like(w), dh0 = at::empty({s.batch, s.heads, s.k_dim, s.v_dim}, q.options());
    auto scratch = at::empty({s.batch, s.heads, s.every + 1, s.k_dim, s.v_dim}, q.options());
    check_launch(cuda::m2rnn_backward(s, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                      f.data_ptr<float>(), ptr_or_null(keep), w.data_ptr<float>(), cps.data_ptr<float>(),
                                      ptr_or_null(dy), ptr_or_null(dh_last),
                                      static_cast<float>(ctx->saved_data["clip"].toDouble()), scratch.data_ptr<float>(),
                                      dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(),
                                      df.data_ptr<float>(), dw.data_ptr<float>(), dh0.data_ptr<float>(),
                                      current_stream(q)));
    return {dq, dk, dv, df, dw, dh0, {}, {}, {}};
  }
};
#endif

}  // namespace

bool m2rnn_fused(const at::Tensor& q, const at::Tensor& v, const at::Tensor& w, int64_t checkpoint_every) {
#ifdef SLM_WITH_CUDA
  if (!q.is_cuda() || q.dim() != 4 || v.dim() != 4) return false;
  if (q.scalar_type() == at::kDouble || w.scalar_type() == at::kDouble) return false;
  if (!cuda::m2rnn_supported(q.size(3), v.size(3)) || checkpoint_every < 1) return false;
  return cuda::m2rnn_backward_smem(fused_shape(q, v, checkpoint_every)) <= 227 * 1024;
#else
  (void)q, (void)v, (void)w, (void)checkpoint_every;
  return false;
#endif
}

std::pair<at::Tensor, at::Tensor> m2rnn_scan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& f, const at::Tensor& w, const at::Tensor& d,
                                             const at::Tensor& h0, double grad_clip, int64_t checkpoint_every,
                                             const at::Tensor& reset) {
  if (!q.defined() || q.dim() != 4) throw Error("m2rnn: q must be [B, T, Nh, K], got " + shape_text(q));
  if (!v.defined() || v.dim() != 4) throw Error("m2rnn: v must be [B, T, Nh, V], got " + shape_text(v));
  const int64_t b = q.size(0), t = q.size(1), nh = q.size(2), kd = q.size(3), vd = v.size(3);
  if (t < 1) throw Error("m2rnn: the sequence holds no tokens");
  if (checkpoint_every < 1) throw Error("m2rnn: checkpoint_every must be >= 1, got " + std::to_string(checkpoint_every));
  expect_shape(k, {b, t, nh, kd}, "k");
  expect_shape(v, {b, t, nh, vd}, "v");
  expect_shape(f, {b, t, nh}, "forget gate");
  expect_shape(w, {nh, vd, vd}, "state_weight");
  expect_shape(d, {nh, vd}, "D");
  expect_shape(h0, {b, nh, kd, vd}, "state");
  if (reset.defined()) expect_shape(reset, {b, t}, "document starts");
  // Under BF16 autocast the projections arrive in bf16 and the parameters in fp32. The hand-written backward needs
  // one dtype throughout, so the recurrence runs in the widest input type with autocast off.
  const auto dt = at::promote_types(at::promote_types(q.scalar_type(), w.scalar_type()), h0.scalar_type());
  std::vector<at::Tensor> out;
  {
    const AutocastScope off(at::kCUDA, false);
#ifdef SLM_WITH_CUDA
    if (m2rnn_fused(q, v, w, checkpoint_every)) {
      // The kernels compute in FP32 whatever the inputs are; the result goes back to the reference's type.
      auto fp32 = [](const at::Tensor& x) { return x.to(at::kFloat).contiguous(); };
      auto keep = reset.defined() ? fp32(reset.logical_not()) : at::empty({0}, q.options().dtype(at::kFloat));
      out = FusedScan::apply(fp32(q), fp32(k), fp32(v), fp32(f), fp32(w), fp32(h0), keep, grad_clip,
                             checkpoint_every);
      out[0] = out[0].to(dt);
      out[1] = out[1].to(dt);
    }
#endif
    if (out.empty()) {
      auto keep = reset.defined() ? reset.logical_not().to(dt) : at::empty({0}, q.options().dtype(dt));
      out = CheckpointedScan::apply(q.to(dt), k.to(dt), v.to(dt), f.to(dt), w.to(dt), h0.to(dt), keep, grad_clip,
                                    checkpoint_every);
    }
  }
  return {out[0] + d * v.to(dt), out[1]};
}

std::pair<at::Tensor, at::Tensor> m2rnn_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& f, const at::Tensor& w, const at::Tensor& d,
                                             const at::Tensor& h) {
  if (!h.defined() || h.dim() != 4) throw Error("m2rnn: state must be [B, Nh, K, V], got " + shape_text(h));
  const int64_t b = h.size(0), nh = h.size(1), kd = h.size(2), vd = h.size(3);
  expect_shape(q, {b, nh, kd}, "step q");
  expect_shape(k, {b, nh, kd}, "step k");
  expect_shape(v, {b, nh, vd}, "step v");
  expect_shape(f, {b, nh}, "step forget gate");
  expect_shape(w, {nh, vd, vd}, "state_weight");
  expect_shape(d, {nh, vd}, "D");
  auto next = update(h, k, v, f, w).h;
  return {read(next, q) + d * v, next};
}

}  // namespace slm::ops
