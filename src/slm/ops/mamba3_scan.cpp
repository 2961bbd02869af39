#include "slm/ops/mamba3_scan.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cstdint>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "slm/ops/fused_kernels.h"
#include "slm/ops/mamba3_step_cpu.h"
#include "slm/ops/rms_norm.h"
#include "slm/util/autocast.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/mamba3_scan_kernels.h"
#include "slm/ops/cuda/mamba3_step_kernel.h"
#endif

namespace slm::ops {

namespace {

constexpr double kTwoPi = 2.0 * std::numbers::pi;

void expect_shape(const at::Tensor& t, const std::vector<int64_t>& shape, const char* what) {
  if (!t.defined() || t.sizes() != at::IntArrayRef(shape))
    throw Error(std::string("mamba3: ") + what + " has shape " + shape_text(t) + ", expected " +
                shape_text(at::empty(shape, at::TensorOptions().device(at::kMeta))));
}

// Phases and decay sums lose too much in half precision, so nothing below float32 is computed in.
at::ScalarType compute_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor heavy_tail(const at::Tensor& u) {
  return u.clamp_min(0) + at::reciprocal(1 - u.clamp_max(0));
}

// t [B, T, H, R, N] rotated by phase [B, T, H, S] on the pairs of the official kernels, i < S: half-split
// (i, i + N/2) for MIMO (TileLang), interleaved (2i, 2i+1) for SISO (Triton).
at::Tensor rotate(const at::Tensor& t, const at::Tensor& phase, bool half_split) {
  const int64_t s = phase.size(-1), n = t.size(-1);
  auto cos = phase.cos().unsqueeze(3), sin = phase.sin().unsqueeze(3);
  if (half_split) {
    const int64_t half = n / 2;
    auto u = t.narrow(-1, 0, s), v = t.narrow(-1, half, s);
    return at::cat(
        {u * cos - v * sin, t.narrow(-1, s, half - s), u * sin + v * cos, t.narrow(-1, half + s, n - half - s)}, -1);
  }
  auto pairs = t.narrow(-1, 0, 2 * s).unflatten(-1, {s, 2});
  auto u = pairs.select(-1, 0), v = pairs.select(-1, 1);
  auto rotated = at::stack({u * cos - v * sin, u * sin + v * cos}, -1).flatten(-2);
  return 2 * s == n ? rotated : at::cat({rotated, t.narrow(-1, 2 * s, n - 2 * s)}, -1);
}

// x [..., H, P] -> per-rank values [..., H, R, P].
at::Tensor rank_values(const at::Tensor& x, const at::Tensor& mimo_x) {
  auto v = x.unsqueeze(-2);
  return mimo_x.defined() ? v * mimo_x : v;
}

// Σ_r v_r k_rᵀ for v [B, H, R, P], k [B, H, R, N] -> [B, H, P, N].
at::Tensor outer_sum(const at::Tensor& v, const at::Tensor& k) {
  return v.transpose(-1, -2).matmul(k);
}

void check_sequence(const Mamba3Sequence& s, const Mamba3State& st) {
  if (!s.q.defined() || s.q.dim() != 5)
    throw Error("mamba3: sequence q must be [B, T, H, R, N], got " + shape_text(s.q));
  const int64_t b = s.q.size(0), t = s.q.size(1), h = s.q.size(2), r = s.q.size(3), n = s.q.size(4);
  if (t < 1) throw Error("mamba3: the sequence holds no tokens");
  const int64_t p = s.x.defined() && s.x.dim() == 4 ? s.x.size(3) : -1;
  expect_shape(s.k, {b, t, h, r, n}, "sequence k");
  expect_shape(s.x, {b, t, h, p}, "sequence x");
  expect_shape(s.a, {b, t, h}, "sequence a");
  expect_shape(s.gamma, {b, t, h}, "sequence gamma");
  expect_shape(s.eps, {b, t, h}, "sequence eps");
  expect_shape(s.d, {h}, "D");
  if (s.mimo_x.defined())
    expect_shape(s.mimo_x, {h, r, p}, "mimo_x");
  else if (r != 1)
    throw Error("mamba3: rank " + std::to_string(r) + " needs mimo_x");
  expect_shape(st.ssm, {b, h, p, n}, "state ssm");
  expect_shape(st.k, {b, h, r, n}, "state k");
  expect_shape(st.x, {b, h, p}, "state x");
  if (s.start.defined()) expect_shape(s.start, {b, t}, "document starts");
}

struct Cast {
  at::Tensor q, k, x, a, gamma, eps, mimo_x, d, ssm, k_prev, x_prev;
};

Cast cast(const Mamba3Sequence& s, const Mamba3State& st) {
  const auto ct = compute_type(s.x);
  auto c = [ct](const at::Tensor& t) { return t.defined() ? t.to(ct) : t; };
  return {c(s.q), c(s.k), c(s.x), c(s.a), c(s.gamma), c(s.eps), c(s.mimo_x), c(s.d), c(st.ssm), c(st.k), c(st.x)};
}

}  // namespace

Mamba3State mamba3_zero_state(int64_t batch, int64_t heads, int64_t headdim, int64_t d_state, int64_t rank,
                              int64_t angles, const at::TensorOptions& options) {
  return {at::zeros({batch, heads, angles}, options), at::zeros({batch, heads, headdim, d_state}, options),
          at::zeros({batch, heads, rank, d_state}, options), at::zeros({batch, heads, headdim}, options)};
}

namespace {

void check_projections(const Mamba3Projections& p, const Mamba3Weights& w, const at::Tensor& angle0,
                       const at::Tensor& start) {
  if (!p.x.defined() || p.x.dim() != 4) throw Error("mamba3: x must be [B, T, H, P], got " + shape_text(p.x));
  if (!p.b.defined() || p.b.dim() != 5) throw Error("mamba3: B must be [B, T, R, G, N], got " + shape_text(p.b));
  const int64_t bsz = p.x.size(0), t = p.x.size(1), h = p.x.size(2), pd = p.x.size(3);
  const int64_t r = p.b.size(2), g = p.b.size(3), n = p.b.size(4);
  const int64_t s = p.angle.defined() && p.angle.dim() == 3 ? p.angle.size(2) : -1;
  if (t < 1) throw Error("mamba3: the sequence holds no tokens");
  if (g < 1 || h % g)
    throw Error("mamba3: " + std::to_string(h) + " heads do not split into " + std::to_string(g) + " groups");
  if (s < 1 || 2 * s > n)
    throw Error("mamba3: " + std::to_string(s) + " rotary angles do not fit d_state " + std::to_string(n));
  expect_shape(p.c, {bsz, t, r, g, n}, "C");
  expect_shape(p.dd_dt, {bsz, t, h}, "dd_dt");
  expect_shape(p.dd_a, {bsz, t, h}, "dd_A");
  expect_shape(p.trap, {bsz, t, h}, "trap");
  expect_shape(p.angle, {bsz, t, s}, "angle");
  expect_shape(w.dt_bias, {h}, "dt_bias");
  expect_shape(w.b_bias, {h, r, n}, "B_bias");
  expect_shape(w.c_bias, {h, r, n}, "C_bias");
  expect_shape(w.b_norm, {n}, "B_norm weight");
  expect_shape(w.c_norm, {n}, "C_norm weight");
  expect_shape(w.d, {h}, "D");
  expect_shape(angle0, {bsz, h, s}, "angle state");
  if (start.defined()) expect_shape(start, {bsz, t}, "document starts");
  if (w.mimo_x.defined())
    expect_shape(w.mimo_x, {h, r, pd}, "mimo_x");
  else if (r != 1)
    throw Error("mamba3: rank " + std::to_string(r) + " needs mimo_x");
}

// The per-token scalars of the recurrence and the rotary phase, in compute type ct.
struct Scalars {
  at::Tensor a, gamma, eps;  // [B, T, H]
  at::Tensor dt;             // [B, T, H] Δ
  at::Tensor theta;          // [B, T, S] π·tanh(angle): the phase advances by Δ·θ per token
  at::Tensor phase;          // [B, T, H, S] in [0, 2π); only when asked for (the fused kernels form their own)
  at::Tensor start;          // [B, T] bool, or undefined
};

Scalars scalars(const Mamba3Projections& p, const Mamba3Weights& w, const at::Tensor& angle0, const at::Tensor& start,
                at::ScalarType ct, bool with_phase) {
  const int64_t bsz = p.x.size(0), t = p.x.size(1), h = p.x.size(2), s = p.angle.size(2);
  Scalars out;
  const auto dt = at::softplus(p.dd_dt.to(ct) + w.dt_bias.to(ct));
  const auto lambda = at::sigmoid(p.trap.to(ct));
  out.a = -heavy_tail(p.dd_a.to(ct)).clamp_min(w.a_floor) * dt;
  out.gamma = lambda * dt;
  out.eps = (1 - lambda) * dt;
  out.dt = dt;
  out.theta = std::numbers::pi * at::tanh(p.angle.to(ct));
  if (start.defined()) {
    out.start = start.to(at::kBool);
    out.eps = out.eps.masked_fill(out.start.unsqueeze(-1), 0.0);
  }
  if (!with_phase) return out;

  // The phase is a running sum; wrapping it into [0, 2π) keeps float32 precise on long sequences (floor has
  // zero gradient, so the wrap does not disturb training).
  auto step = dt.unsqueeze(-1) * out.theta.unsqueeze(2);  // [B, T, H, S]
  auto phase = at::cumsum(step, 1);
  if (!start.defined()) {
    phase = phase + angle0.to(ct).unsqueeze(1);
  } else {
    // Each token subtracts the running sum before its document's start; the row's first segment, when no
    // document starts at t = 0, continues from angle0 instead.
    const auto& st = out.start;
    auto a0 = angle0.to(ct).unsqueeze(1);
    auto fallback = at::cat({-a0, at::zeros_like(a0).expand({bsz, t - 1, h, s})}, 1);
    auto before = at::where(st.view({bsz, t, 1, 1}), phase - step, fallback);
    auto index = at::arange(t, start.options().dtype(at::kLong)).expand({bsz, t});
    auto first = std::get<0>(at::cummax(at::where(st, index, at::zeros_like(index)), 1));  // [B, T]
    phase = phase - before.gather(1, first.view({bsz, t, 1, 1}).expand_as(phase));
  }
  out.phase = phase - kTwoPi * at::floor(phase / kTwoPi);
  return out;
}

// RMSNorm_N(bc)·gain [B, T, R, G, N] in compute type ct.
at::Tensor normed(const at::Tensor& bc, const at::Tensor& gain, const Mamba3Weights& w, at::ScalarType ct) {
  return rms_norm(bc.to(ct), gain.to(ct), w.norm_eps);
}

// Normed B or C [B, T, R, G, N] -> per-head rotated keys or queries [B, T, H, R, N].
at::Tensor heads_of(const at::Tensor& normed_bc, const at::Tensor& bias, const at::Tensor& phase, int64_t heads,
                    bool half_split) {
  auto x = normed_bc;
  const int64_t g = x.size(3);
  if (g != heads) x = x.repeat_interleave(heads / g, 3);
  return rotate(x.permute({0, 1, 3, 2, 4}) + bias.to(x.scalar_type()), phase, half_split);
}

}  // namespace

Mamba3Sequence mamba3_preprocess(const Mamba3Projections& p, const Mamba3Weights& w, const at::Tensor& angle0,
                                 const at::Tensor& start) {
  check_projections(p, w, angle0, start);
  const int64_t t = p.x.size(1), h = p.x.size(2);
  const auto ct = compute_type(p.x);
  const Scalars sc = scalars(p, w, angle0, start, ct, true);
  Mamba3Sequence out;
  out.a = sc.a;
  out.gamma = sc.gamma;
  out.eps = sc.eps;
  out.start = sc.start;
  const bool half_split = w.mimo_x.defined();
  out.q = heads_of(normed(p.c, w.c_norm, w, ct), w.c_bias, sc.phase, h, half_split);
  out.k = heads_of(normed(p.b, w.b_norm, w, ct), w.b_bias, sc.phase, h, half_split);
  out.x = p.x.to(ct);
  out.final_angle = sc.phase.select(1, t - 1);
  out.mimo_x = w.mimo_x.defined() ? w.mimo_x.to(ct) : w.mimo_x;
  out.d = w.d.to(ct);
  return out;
}

std::pair<at::Tensor, Mamba3State> mamba3_scan_sequential(const Mamba3Sequence& s, const Mamba3State& state) {
  check_sequence(s, state);
  const Cast c = cast(s, state);
  const int64_t t = c.q.size(1);
  auto ssm = c.ssm;
  auto k_prev = c.k_prev;
  auto v_prev = rank_values(c.x_prev, c.mimo_x);
  auto v = rank_values(c.x, c.mimo_x);  // [B, T, H, R, P]
  auto alpha = at::exp(c.a).unsqueeze(-1).unsqueeze(-1);
  auto beta = c.eps.unsqueeze(-1).unsqueeze(-1) * alpha;  // ε is 0 where a document starts
  if (s.start.defined()) alpha = alpha * s.start.logical_not().to(alpha.scalar_type()).view({c.q.size(0), t, 1, 1, 1});
  auto gamma = c.gamma.unsqueeze(-1).unsqueeze(-1);
  auto d = c.d.view({-1, 1, 1});
  std::vector<at::Tensor> ys;
  ys.reserve(t);
  for (int64_t i = 0; i < t; ++i) {
    auto q_i = c.q.select(1, i), k_i = c.k.select(1, i), v_i = v.select(1, i);
    ssm = alpha.select(1, i) * ssm + beta.select(1, i) * outer_sum(v_prev, k_prev) +
          gamma.select(1, i) * outer_sum(v_i, k_i);
    ys.push_back(q_i.matmul(ssm.transpose(-1, -2)) + d * v_i);
    k_prev = k_i;
    v_prev = v_i;
  }
  return {at::stack(ys, 1), {s.final_angle, ssm, k_prev, c.x.select(1, t - 1)}};
}

std::pair<at::Tensor, Mamba3State> mamba3_step(const Mamba3Sequence& s, const Mamba3State& state) {
  if (s.q.defined() && s.q.dim() == 5 && s.q.size(1) != 1)
    throw Error("mamba3: a decode step takes one token, got " + std::to_string(s.q.size(1)));
  return mamba3_scan_sequential(s, state);
}

std::pair<at::Tensor, Mamba3State> mamba3_scan_chunked(const Mamba3Sequence& s, const Mamba3State& state,
                                                       int64_t chunk_size) {
  check_sequence(s, state);
  if (chunk_size < 1) throw Error("mamba3: chunk_size must be >= 1, got " + std::to_string(chunk_size));
  const Cast c = cast(s, state);
  const int64_t b = c.q.size(0), t = c.q.size(1), h = c.q.size(2), r = c.q.size(3), n = c.q.size(4);
  const int64_t p = c.x.size(3), q_len = chunk_size, nc = (t + q_len - 1) / q_len, pad = nc * q_len - t;
  const int64_t qr = q_len * r;

  // σ_s = γ_s + ε_{s+1} couples each token to the next one across chunk boundaries, so it is formed on the
  // whole sequence; past the last token ε is 0 (its β term belongs to the next call, via the initial state).
  auto eps_next = at::constant_pad_nd(c.eps.narrow(1, 1, t - 1), {0, 0, 0, 1});
  auto sigma = c.gamma + eps_next;

  // Token-major [B, T, H, ...] -> head-major chunks [B, H, nc, Q(·R), ...]; padded tokens have zero
  // inputs and zero decay, so they leave both the outputs and the final state untouched.
  auto chunk_rows = [&](const at::Tensor& x5) {  // [B, T, H, R, X] -> [B, H, nc, Q·R, X]
    return at::constant_pad_nd(x5, {0, 0, 0, 0, 0, 0, 0, pad})
        .permute({0, 2, 1, 3, 4})
        .reshape({b, h, nc, qr, x5.size(4)});
  };
  auto chunk_scalars = [&](const at::Tensor& x3) {  // [B, T, H] -> [B, H, nc, Q]
    return at::constant_pad_nd(x3, {0, 0, 0, pad}).permute({0, 2, 1}).reshape({b, h, nc, q_len});
  };
  auto per_row = [&](const at::Tensor& x4) {  // [B, H, nc, Q] -> [B, H, nc, Q·R, 1]
    return x4.unsqueeze(-1).expand({b, h, nc, q_len, r}).reshape({b, h, nc, qr, 1});
  };
  auto v_tok = rank_values(c.x, c.mimo_x);  // [B, T, H, R, P]
  auto qc = chunk_rows(c.q), kc = chunk_rows(c.k), vc = chunk_rows(v_tok);
  auto cum = at::cumsum(chunk_scalars(c.a), -1);  // c̄, inclusive within each chunk
  auto sig = chunk_scalars(sigma), gam = chunk_scalars(c.gamma);

  // Packed documents: every decay and carry between two positions applies only when no document starts in
  // between, i.e. when both positions have the same document counter (the initial state has counter 0).
  // doc [B, 1, nc, Q]: padded tokens take the last token's counter, so the final state follows the last document.
  at::Tensor doc, doc_end, doc_enter;
  if (s.start.defined()) {
    auto counter = at::cumsum(s.start.to(at::kLong), 1);
    counter = at::cat({counter, counter.narrow(1, t - 1, 1).expand({b, pad})}, 1);
    doc = counter.view({b, 1, nc, q_len});
    doc_end = doc.select(-1, q_len - 1);               // [B, 1, nc]
    doc_enter = at::constant_pad_nd(doc_end, {1, 0});  // [B, 1, nc + 1], entering chunk j
  }
  auto same_doc = [&](const at::Tensor& x, const at::Tensor& y) { return (x == y).to(cum.scalar_type()); };

  // Intra-chunk: L[t,s] = e^{c̄_t - c̄_s} σ_s below the diagonal, γ_t on it, one block per rank pair. The
  // exponent is clamped at 0 so the (masked) upper triangle cannot overflow into inf·0 = NaN.
  auto opts = cum.options();
  auto strict = at::ones({q_len, q_len}, opts).tril(-1);
  auto eye = at::eye(q_len, opts);
  auto decay = at::exp((cum.unsqueeze(-1) - cum.unsqueeze(-2)).clamp_max(0));
  auto below = decay * sig.unsqueeze(-2) * strict;
  if (doc.defined()) below = below * same_doc(doc.unsqueeze(-1), doc.unsqueeze(-2));
  auto lmask = below + gam.unsqueeze(-1) * eye;  // [B, H, nc, Q, Q]
  lmask = lmask.unsqueeze(-1).unsqueeze(-3).expand({b, h, nc, q_len, r, q_len, r}).reshape({b, h, nc, qr, qr});
  auto y = (qc.matmul(kc.transpose(-1, -2)) * lmask).matmul(vc);  // [B, H, nc, Q·R, P]

  // Each chunk's own contribution to the state at its end (as if it started from zero).
  auto last = cum.narrow(-1, q_len - 1, 1);  // [B, H, nc, 1]
  auto to_end = at::exp(last - cum) * sig;
  if (doc.defined()) to_end = to_end * same_doc(doc, doc_end.unsqueeze(-1));
  auto w_loc = per_row(to_end);
  auto h_loc = (vc * w_loc).transpose(-1, -2).matmul(kc);  // [B, H, nc, P, N]

  // Carry across chunks as one matmul: the state entering chunk j (j = nc is the final state) is
  // e^{C_j} H_0 + Σ_{i<j} e^{C_j - C_{i+1}} h_loc_i, with C_j the decay summed over chunks before j.
  auto totals = last.squeeze(-1);                 // [B, H, nc]
  auto incl = at::cumsum(totals, -1);             // C_{i+1}
  auto excl = at::constant_pad_nd(incl, {1, 0});  // C_j, j = 0..nc
  auto carry_mask = at::ones({nc + 1, nc}, opts).tril(-1);
  auto carry = at::exp((excl.unsqueeze(-1) - incl.unsqueeze(-2)).clamp_max(0)) * carry_mask;  // [B, H, nc+1, nc]
  auto from_h0 = at::exp(excl);                                                               // [B, H, nc+1]
  if (doc.defined()) {
    carry = carry * same_doc(doc_enter.unsqueeze(-1), doc_end.unsqueeze(-2));
    from_h0 = from_h0 * same_doc(doc_enter, at::zeros_like(doc_enter));
  }
  // H_0 takes the pending β term of the cached token: β_0 = ε_0 α_0, and α_0 is part of every e^{c̄}.
  auto h0 =
      c.ssm + c.eps.select(1, 0).unsqueeze(-1).unsqueeze(-1) * outer_sum(rank_values(c.x_prev, c.mimo_x), c.k_prev);
  auto states = carry.matmul(h_loc.reshape({b, h, nc, p * n})) + from_h0.unsqueeze(-1) * h0.reshape({b, h, 1, p * n});
  states = states.view({b, h, nc + 1, p, n});

  // Inter-chunk: each query reads the state entering its chunk, decayed to its position.
  auto from_enter = at::exp(cum);
  if (doc.defined()) from_enter = from_enter * same_doc(doc, doc_enter.narrow(-1, 0, nc).unsqueeze(-1));
  y = y + per_row(from_enter) * qc.matmul(states.narrow(2, 0, nc).transpose(-1, -2));
  y = y.view({b, h, nc * q_len, r, p}).narrow(2, 0, t).permute({0, 2, 1, 3, 4});
  y = y + c.d.view({-1, 1, 1}) * v_tok;
  return {y, {s.final_angle, states.select(2, nc), c.k.select(1, t - 1), c.x.select(1, t - 1)}};
}

#ifdef SLM_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const float* ptr_or_null(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? t.data_ptr<float>() : nullptr;
}

// x [B, T, H, P], bn [B, T, R, G, N] and theta [B, T, S] give the kernels' shape.
cuda::Mamba3Shape fused_shape(const at::Tensor& x, const at::Tensor& bn, const at::Tensor& theta) {
  return {x.size(0), x.size(1), x.size(2), bn.size(3), x.size(3), bn.size(4), theta.size(2), bn.size(2)};
}

// The FusedScan inputs in their order: x, bn, cn, b_bias, c_bias, dt, theta, angle0, a, gamma, sigma, d, start,
// mimo_x.
cuda::Mamba3ScanInputs scan_inputs(const variable_list& t) {
  auto f = [&](int i) -> const float* { return t[i].data_ptr<float>(); };
  return {f(0),
          f(1),
          f(2),
          f(3),
          f(4),
          f(5),
          f(6),
          f(7),
          f(8),
          f(9),
          f(10),
          f(11),
          ptr_or_null(t[13]),
          t[12].numel() > 0 ? t[12].data_ptr<uint8_t>() : nullptr};
}

// The scan through the fused kernels of ops/cuda/mamba3_scan_kernels.cu, FP32 contiguous inputs:
// x, bn [B, T, R, G, N], cn, b_bias [H, R, N], c_bias, dt, theta, angle0, a, gamma, sigma, d, start (uint8, empty:
// none), mimo_x [H, R, P] (empty: SISO), h0 -> y [B, T, H, R, P], h_last, final_angle.
class FusedScan : public torch::autograd::Function<FusedScan> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bn, const at::Tensor& cn,
                               const at::Tensor& b_bias, const at::Tensor& c_bias, const at::Tensor& dt,
                               const at::Tensor& theta, const at::Tensor& angle0, const at::Tensor& a,
                               const at::Tensor& gamma, const at::Tensor& sigma, const at::Tensor& d,
                               const at::Tensor& start, const at::Tensor& mimo_x, const at::Tensor& h0) {
    const c10::cuda::CUDAGuard guard(x.device());
    const auto s = fused_shape(x, bn, theta);
    const int64_t chunk = cuda::mamba3_chunk(s.rank), chunks = (s.tokens + chunk - 1) / chunk;
    const variable_list in = {x, bn, cn, b_bias, c_bias, dt, theta, angle0, a, gamma, sigma, d, start, mimo_x};
    // Inside forward grad mode is off, but the inputs still say whether a backward can follow.
    bool training = h0.requires_grad();
    for (const auto& t : in) training = training || t.requires_grad();
    auto y = at::empty({s.batch, s.tokens, s.heads, s.rank, s.headdim}, x.options());
    auto h_last = at::empty_like(h0);
    auto final_angle = at::empty_like(angle0);
    at::Tensor cps_state, cps_phase;
    if (training) {
      cps_state = at::empty({s.batch, s.heads, chunks, s.headdim, s.d_state}, x.options());
      cps_phase = at::empty({s.batch, s.heads, chunks, s.angles}, x.options());
    }
    const cuda::Mamba3Checkpoints cps{training ? cps_state.data_ptr<float>() : nullptr,
                                      training ? cps_phase.data_ptr<float>() : nullptr};
    check_launch(cuda::mamba3_forward(s, scan_inputs(in), h0.data_ptr<float>(), y.data_ptr<float>(),
                                      h_last.data_ptr<float>(), final_angle.data_ptr<float>(), cps,
                                      current_stream(x)));
    if (training) {
      auto saved = in;
      saved.push_back(cps_state);
      saved.push_back(cps_phase);
      ctx->save_for_backward(saved);
    }
    return {y, h_last, final_angle};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &bn = saved[1], &theta = saved[6], &angle0 = saved[7];
    const c10::cuda::CUDAGuard guard(x.device());
    const auto s = fused_shape(x, bn, theta);
    auto f32 = [](const at::Tensor& g) { return g.defined() ? g.to(at::kFloat).contiguous() : at::Tensor(); };
    const auto dy = f32(grads[0]), dh_last = f32(grads[1]), dfinal = f32(grads[2]);
    const auto o = x.options();
    auto dx = at::empty_like(x);
    auto dk_pre = at::empty({s.batch, s.tokens, s.rank, s.heads, s.d_state}, o), dq_pre = at::empty_like(dk_pre);
    auto da = at::empty_like(saved[8]), dgamma = at::empty_like(da), dsigma = at::empty_like(da);
    auto ddt = at::zeros_like(da), dtheta = at::zeros_like(theta), dangle0 = at::empty_like(angle0);
    auto dd = at::zeros({s.heads}, o), dh0 = at::empty({s.batch, s.heads, s.headdim, s.d_state}, o);
    const bool mimo = saved[13].numel() > 0;
    auto dmimo_x = mimo ? at::zeros_like(saved[13]) : at::Tensor();
    const cuda::Mamba3ScanGrads g{
        dx.data_ptr<float>(),      dk_pre.data_ptr<float>(), dq_pre.data_ptr<float>(),
        da.data_ptr<float>(),      dgamma.data_ptr<float>(), dsigma.data_ptr<float>(),
        dangle0.data_ptr<float>(), dh0.data_ptr<float>(),    ddt.data_ptr<float>(),
        dtheta.data_ptr<float>(),  dd.data_ptr<float>(),     mimo ? dmimo_x.data_ptr<float>() : nullptr};
    const cuda::Mamba3Checkpoints cps{saved[14].data_ptr<float>(), saved[15].data_ptr<float>()};
    check_launch(cuda::mamba3_backward(s, scan_inputs(saved), cps, ptr_or_null(dy), ptr_or_null(dh_last),
                                       ptr_or_null(dfinal), g,
                                       current_stream(x)));
    // Heads share their group's B and C, and every token adds to the biases ([R, H, N] -> [H, R, N]).
    auto to_groups = [&](const at::Tensor& t) {
      return t.view({s.batch, s.tokens, s.rank, s.groups, s.heads / s.groups, s.d_state}).sum(4);
    };
    return {dx,
            to_groups(dk_pre),
            to_groups(dq_pre),
            dk_pre.sum(at::IntArrayRef{0, 1}).transpose(0, 1),
            dq_pre.sum(at::IntArrayRef{0, 1}).transpose(0, 1),
            ddt,
            dtheta,
            dangle0,
            da,
            dgamma,
            dsigma,
            dd,
            {},
            dmimo_x,
            dh0};
  }
};

}  // namespace
#endif

bool mamba3_step_fusable(const at::Tensor& proj, const Mamba3Weights& w, const Mamba3State& state) {
  if (!proj.defined() || proj.dim() != 2 || !proj.is_contiguous() || w.mimo_x.defined()) return false;
  const auto dt = proj.scalar_type();
  if (proj.is_cuda()) {
#ifdef SLM_WITH_CUDA
    if (dt != at::kFloat && dt != at::kBFloat16) return false;
    // The kernel reads the state by float4.
    if (!state.ssm.defined() || state.ssm.dim() != 4 || state.ssm.size(3) % 4 ||
        reinterpret_cast<uintptr_t>(state.ssm.data_ptr()) % 16)
      return false;
#else
    return false;
#endif
  } else if (!proj.is_cpu() || dt != at::kFloat) {
    return false;
  }
  for (const auto* t : {&w.dt_bias, &w.b_bias, &w.c_bias, &w.b_norm, &w.c_norm, &w.d})
    if (!t->defined() || t->scalar_type() != dt || !t->is_contiguous() || t->device() != proj.device()) return false;
  for (const auto* t : {&state.angle, &state.ssm, &state.k, &state.x})
    if (!t->defined() || t->scalar_type() != at::kFloat || !t->is_contiguous() || t->device() != proj.device())
      return false;
  return state.k.dim() == 4 && state.k.size(2) == 1 && 2 * state.angle.size(2) <= state.ssm.size(3);
}

std::pair<at::Tensor, Mamba3State> mamba3_step_fused(const at::Tensor& proj, const Mamba3StepLayout& l,
                                                     const Mamba3Weights& w, const Mamba3State& state,
                                                     bool ssm_in_place) {
  if (!mamba3_step_fusable(proj, w, state))
    throw Error(
        "mamba3: the fused decode step does not take this layer (SISO; FP32 on the CPU, FP32/BF16 on CUDA; FP32 "
        "state)");
  const int64_t b = proj.size(0);
  if (proj.size(1) != 2 * l.d_inner + 2 * l.groups * l.d_state + 3 * l.heads + l.angles ||
      l.d_inner != l.heads * l.headdim || l.heads % l.groups != 0)
    throw Error("mamba3: the in_proj row of " + std::to_string(proj.size(1)) + " entries does not match the layout");
  expect_shape(state.ssm, {b, l.heads, l.headdim, l.d_state}, "state ssm");
  expect_shape(state.angle, {b, l.heads, l.angles}, "state angle");
  expect_shape(state.k, {b, l.heads, 1, l.d_state}, "state k");
  expect_shape(state.x, {b, l.heads, l.headdim}, "state x");
#ifdef SLM_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> guard;
  if (proj.is_cuda()) guard.emplace(proj.device());
#endif
  // The angle, key and x stay out of place: the GPU's CTAs of one head all read the previous ones.
  Mamba3State next{at::empty_like(state.angle), ssm_in_place ? state.ssm : at::empty_like(state.ssm),
                   at::empty_like(state.k), at::empty_like(state.x)};
  auto y = at::empty({b, 1, l.heads, 1, l.headdim}, state.ssm.options());
  const Mamba3StepShape shape{b,
                              l.heads,
                              l.headdim,
                              l.groups,
                              l.d_state,
                              l.angles,
                              l.d_inner,
                              proj.size(1),
                              static_cast<float>(w.a_floor),
                              static_cast<float>(w.norm_eps)};
  const Mamba3StepArgs args{proj.data_ptr(),
                            w.dt_bias.data_ptr(),
                            w.b_bias.data_ptr(),
                            w.c_bias.data_ptr(),
                            w.b_norm.data_ptr(),
                            w.c_norm.data_ptr(),
                            w.d.data_ptr(),
                            state.angle.data_ptr<float>(),
                            state.ssm.data_ptr<float>(),
                            state.k.data_ptr<float>(),
                            state.x.data_ptr<float>(),
                            next.angle.data_ptr<float>(),
                            next.ssm.data_ptr<float>(),
                            next.k.data_ptr<float>(),
                            next.x.data_ptr<float>(),
                            y.data_ptr<float>()};
  if (proj.is_cpu()) {
    mamba3_step_cpu(shape, args);
    return {y, next};
  }
#ifdef SLM_WITH_CUDA
  check_launch(cuda::mamba3_step(shape, proj.scalar_type() == at::kBFloat16, args,
                                 current_stream(proj)));
#endif
  return {y, next};
}

bool mamba3_fused_supported(bool cuda, at::ScalarType dtype, int64_t headdim, int64_t d_state, int64_t angles,
                            int64_t rank) {
#ifdef SLM_WITH_CUDA
  return cuda && dtype != at::kDouble && cuda::mamba3_supported(headdim, d_state, angles, rank);
#else
  (void)cuda, (void)dtype, (void)headdim, (void)d_state, (void)angles, (void)rank;
  return false;
#endif
}

bool mamba3_fused(const Mamba3Projections& p, const Mamba3Weights& w) {
  if (!p.x.defined() || p.x.dim() != 4) return false;
  if (!p.b.defined() || p.b.dim() != 5 || !p.angle.defined() || p.angle.dim() != 3) return false;
  // Rank R > 1 is MIMO: it comes with mimo_x (check_projections throws on the other combinations).
  const int64_t rank = p.b.size(2);
  if (w.mimo_x.defined() != (rank > 1)) return false;
  return mamba3_fused_supported(p.x.is_cuda(), p.x.scalar_type(), p.x.size(3), p.b.size(4), p.angle.size(2), rank);
}

std::pair<at::Tensor, Mamba3State> mamba3_scan_fused(const Mamba3Projections& p, const Mamba3Weights& w,
                                                     const Mamba3State& state, const at::Tensor& start) {
  check_projections(p, w, state.angle, start);
  if (!mamba3_fused(p, w))
    throw Error(
        "mamba3: the fused scan does not take this layer (CUDA, FP32/BF16, headdim 32/64, SISO with d_state "
        "32/64/128 or MIMO rank 2/4 with d_state 64/128)");
#ifdef SLM_WITH_CUDA
  const int64_t b = p.x.size(0), t = p.x.size(1), h = p.x.size(2), pd = p.x.size(3), r = p.b.size(2), n = p.b.size(4);
  expect_shape(state.ssm, {b, h, pd, n}, "state ssm");
  expect_shape(state.k, {b, h, r, n}, "state k");
  expect_shape(state.x, {b, h, pd}, "state x");
  // The kernels have their own backward in FP32: autocast stays off inside, like the reference's compute type.
  const AutocastScope off(at::kCUDA, false);
  const auto f32 = at::kFloat;
  auto c = [](const at::Tensor& x) { return x.to(at::kFloat).contiguous(); };
  const Scalars sc = scalars(p, w, state.angle, start, f32, false);
  const auto bn = normed(p.b, w.b_norm, w, f32), cn = normed(p.c, w.c_norm, w, f32);
  // σ_t = γ_t + ε_{t+1}; the last token's ε_{t+1} belongs to the next call (via the state's pending term).
  const auto sigma = sc.gamma + at::constant_pad_nd(sc.eps.narrow(1, 1, t - 1), {0, 0, 0, 1});
  const bool mimo = w.mimo_x.defined();
  const auto mimo_x = mimo ? c(w.mimo_x) : at::empty({0}, p.x.options().dtype(f32));
  // H_0 takes the pending β term of the cached token, as in mamba3_scan_chunked.
  const auto h0 =
      state.ssm.to(f32) + sc.eps.select(1, 0).unsqueeze(-1).unsqueeze(-1) *
                              outer_sum(rank_values(state.x.to(f32), mimo ? mimo_x : at::Tensor()), state.k.to(f32));
  const auto st =
      sc.start.defined() ? sc.start.to(at::kByte).contiguous() : at::empty({0}, p.x.options().dtype(at::kByte));
  const auto x = c(p.x);
  auto out = FusedScan::apply(x, bn.contiguous(), cn.contiguous(), c(w.b_bias), c(w.c_bias), sc.dt.contiguous(),
                              sc.theta.contiguous(), c(state.angle), sc.a.contiguous(), sc.gamma.contiguous(),
                              sigma.contiguous(), c(w.d), st, mimo_x, h0.contiguous());
  // The carried key is the last token's, rotated by the phase after it.
  auto k_last = heads_of(bn.narrow(1, t - 1, 1), w.b_bias, out[2].unsqueeze(1), h, mimo).select(1, 0);
  return {out[0], {out[2], out[1], k_last, x.select(1, t - 1)}};
#else
  (void)state;
  return {};
#endif
}

at::Tensor mamba3_gate(const at::Tensor& y, const at::Tensor& z, const at::Tensor& mimo_z, const at::Tensor& mimo_o,
                       const at::Tensor& norm_weight, double norm_eps) {
  if (!y.defined() || y.dim() != 5) throw Error("mamba3: gate input y must be [B, T, H, R, P], got " + shape_text(y));
  const int64_t b = y.size(0), t = y.size(1), h = y.size(2), r = y.size(3), p = y.size(4);
  expect_shape(z, {b, t, h, p}, "z");
  if (mimo_z.defined() != mimo_o.defined()) throw Error("mamba3: mimo_z and mimo_o come together");
  if (mimo_z.defined()) {
    expect_shape(mimo_z, {h, r, p}, "mimo_z");
    expect_shape(mimo_o, {h, r, p}, "mimo_o");
  } else if (r != 1) {
    throw Error("mamba3: rank " + std::to_string(r) + " needs mimo_z and mimo_o");
  }
  auto o = y;
  if (norm_weight.defined()) {
    expect_shape(norm_weight, {h * p}, "out_norm weight");
    o = rms_norm(o, std::nullopt, norm_eps) * norm_weight.to(o.scalar_type()).view({h, 1, p});
  }
  auto zr = z.to(o.scalar_type()).unsqueeze(3);
  if (mimo_z.defined()) zr = zr * mimo_z.to(o.scalar_type());
  o = o * at::silu(zr);
  if (mimo_o.defined()) o = o * mimo_o.to(o.scalar_type());
  return o.sum(3).flatten(2);
}

}  // namespace slm::ops
