// Mamba-3 against loops written here from the paper (arXiv 2603.15569) as mamba3_scan.h writes its formulas, in
// float64 scalars: MIMO rank 2 with 2 B/C groups, partial rotation on the official
// MIMO pairs, non-zero B/C biases and a mid-sequence state, from the raw in_proj outputs through the gate; and
// the heads-to-groups mapping of B/C on its own.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "ops/mamba3_fixture.h"
#include "slm/ops/mamba3_scan.h"

using namespace slm;
using namespace slm::test;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

double elem(const torch::Tensor& t, std::initializer_list<int64_t> index) {
  torch::Tensor v = t;
  for (int64_t i : index) v = v.select(0, i);
  return v.item<double>();
}

// x / sqrt(mean(x²) + eps), elementwise gain.
std::vector<double> rms_normed(const std::vector<double>& x, const std::vector<double>& gain, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  const double inv = 1.0 / std::sqrt(ms / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * gain[i];
  return out;
}

struct GateWeights {
  torch::Tensor z, mimo_z, mimo_o, norm;  // [B, T, H, P], [H, R, P], [H, R, P], [H·P]
  double eps = 1e-5;
};

struct Reference {
  torch::Tensor out;    // [B, T, H·P] after the gate
  torch::Tensor ssm;    // [B, H, P, N] after the last token
  torch::Tensor k;      // [B, H, R, N] rotated k̃ of the last token
  torch::Tensor angle;  // [B, H, S] phase after the last token (not wrapped)
};

// The layer's recurrence token by token, per (batch, head), from the in_proj outputs:
//   Δ = softplus(dd_dt + dt_bias), A = -max(f(dd_A), A_floor), f(u) = 1+u (u ≥ 0), 1/(1-u) (u < 0), a = AΔ,
//   λ = σ(trap), γ = λΔ, β = (1-λ)Δ·exp(a);
//   φ += Δ·π·tanh(angle) (per angle, shared by the heads); head h reads B/C group h / (H/G);
//   k_r = RMSNorm_N(B_r)·w_B + B_bias[h, r], rotated on the official MIMO pairs (i, i + N/2), i < S (q from C);
//   v_r = x ⊙ mimo_x[h, r];  S = αS + β Σ_r v_{prev,r} k_{prev,r}ᵀ + γ Σ_r v_r k_rᵀ;  y_r = S q_r + D v_r;
//   out = Σ_r RMSNorm_P(y_r)·w ⊙ silu(z ⊙ mimo_z[h, r]) ⊙ mimo_o[h, r].
Reference reference(const Mamba3Inputs& in, const GateWeights& gw) {
  const auto& p = in.proj;
  const auto& w = in.weights;
  const int64_t B = p.x.size(0), T = p.x.size(1), H = p.x.size(2), P = p.x.size(3);
  const int64_t R = p.b.size(2), G = p.b.size(3), N = p.b.size(4), S = p.angle.size(2);
  Reference ref{torch::zeros({B, T, H * P}, kF64), torch::zeros({B, H, P, N}, kF64), torch::zeros({B, H, R, N}, kF64),
                torch::zeros({B, H, S}, kF64)};
  std::vector<double> b_gain(N), c_gain(N);
  for (int64_t n = 0; n < N; ++n) b_gain[n] = elem(w.b_norm, {n}), c_gain[n] = elem(w.c_norm, {n});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      std::vector<double> phase(S);
      for (int64_t s = 0; s < S; ++s) phase[s] = elem(in.state.angle, {b, h, s});
      std::vector<std::vector<double>> state(P, std::vector<double>(N));
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < N; ++n) state[i][n] = elem(in.state.ssm, {b, h, i, n});
      std::vector<std::vector<double>> k_prev(R, std::vector<double>(N));
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < N; ++n) k_prev[r][n] = elem(in.state.k, {b, h, r, n});
      std::vector<double> x_prev(P);
      for (int64_t i = 0; i < P; ++i) x_prev[i] = elem(in.state.x, {b, h, i});
      for (int64_t t = 0; t < T; ++t) {
        const double dt = std::log1p(std::exp(elem(p.dd_dt, {b, t, h}) + elem(w.dt_bias, {h})));
        const double u = elem(p.dd_a, {b, t, h});
        const double A = -std::max(u >= 0 ? 1 + u : 1 / (1 - u), w.a_floor);
        const double alpha = std::exp(A * dt);
        const double lambda = 1 / (1 + std::exp(-elem(p.trap, {b, t, h})));
        const double gamma = lambda * dt, beta = (1 - lambda) * dt * alpha;
        for (int64_t s = 0; s < S; ++s) phase[s] += dt * std::numbers::pi * std::tanh(elem(p.angle, {b, t, s}));
        // B (keys) and C (queries) of every rank: norm, per-head bias, rotation.
        auto rotated = [&](const torch::Tensor& raw, const std::vector<double>& gain, const torch::Tensor& bias,
                           int64_t r) {
          std::vector<double> v(N);
          for (int64_t n = 0; n < N; ++n) v[n] = elem(raw, {b, t, r, g, n});
          v = rms_normed(v, gain, w.norm_eps);
          for (int64_t n = 0; n < N; ++n) v[n] += elem(bias, {h, r, n});
          for (int64_t i = 0; i < S; ++i) {
            const double c = std::cos(phase[i]), sn = std::sin(phase[i]), v0 = v[i], v1 = v[i + N / 2];
            v[i] = v0 * c - v1 * sn;
            v[i + N / 2] = v0 * sn + v1 * c;
          }
          return v;
        };
        std::vector<std::vector<double>> k(R), q(R), v(R, std::vector<double>(P)), v_prev(R, std::vector<double>(P));
        for (int64_t r = 0; r < R; ++r) {
          k[r] = rotated(p.b, b_gain, w.b_bias, r);
          q[r] = rotated(p.c, c_gain, w.c_bias, r);
          for (int64_t i = 0; i < P; ++i) {
            const double mx = elem(w.mimo_x, {h, r, i});
            v[r][i] = elem(p.x, {b, t, h, i}) * mx;
            v_prev[r][i] = x_prev[i] * mx;
          }
        }
        for (int64_t i = 0; i < P; ++i)
          for (int64_t n = 0; n < N; ++n) {
            double s = alpha * state[i][n];
            for (int64_t r = 0; r < R; ++r) s += beta * v_prev[r][i] * k_prev[r][n] + gamma * v[r][i] * k[r][n];
            state[i][n] = s;
          }
        std::vector<double> out(P, 0.0);
        for (int64_t r = 0; r < R; ++r) {
          std::vector<double> y(P), norm_gain(P);
          for (int64_t i = 0; i < P; ++i) {
            y[i] = elem(w.d, {h}) * v[r][i];
            for (int64_t n = 0; n < N; ++n) y[i] += state[i][n] * q[r][n];
            norm_gain[i] = elem(gw.norm, {h * P + i});
          }
          y = rms_normed(y, norm_gain, gw.eps);
          for (int64_t i = 0; i < P; ++i) {
            const double zz = elem(gw.z, {b, t, h, i}) * elem(gw.mimo_z, {h, r, i});
            out[i] += y[i] * zz / (1 + std::exp(-zz)) * elem(gw.mimo_o, {h, r, i});
          }
        }
        for (int64_t i = 0; i < P; ++i) ref.out[b][t][h * P + i] = out[i];
        k_prev = k;
        for (int64_t i = 0; i < P; ++i) x_prev[i] = elem(p.x, {b, t, h, i});
      }
      for (int64_t i = 0; i < P; ++i)
        for (int64_t n = 0; n < N; ++n) ref.ssm[b][h][i][n] = state[i][n];
      for (int64_t r = 0; r < R; ++r)
        for (int64_t n = 0; n < N; ++n) ref.k[b][h][r][n] = k_prev[r][n];
      for (int64_t s = 0; s < S; ++s) ref.angle[b][h][s] = phase[s];
    }
  }
  return ref;
}

}  // namespace

// MIMO rank 2, G = 2 groups over H = 4 heads, N = 8 with S = 2 angles (rope_fraction 0.5: pairs (0, 4) and (1, 5)
// turn, 2, 3, 6, 7 do not), B/C biases around 1, a mid-sequence state, one A on its floor; the sequential scan
// and the chunked one (chunks that do not divide T) through the gate == the loop above.
TEST(Mamba3Reference, MimoRank2GroupsPartialRotationMatchesAFloat64Loop) {
  torch::set_num_threads(1);
  torch::manual_seed(11);
  const Mamba3Case c{2, 9, 4, 3, 8, 2, 2, 2};
  auto in = random_mamba3(c, torch::kDouble);
  in.proj.dd_a[1][4][2] = -2e4;  // f = 1/(1 + 2e4) < A_floor: the floor holds A
  in.weights.a_floor = 1e-4;
  in.weights.norm_eps = 1e-5;
  GateWeights gw{torch::randn({c.batch, c.tokens, c.heads, c.headdim}, kF64),
                 torch::randn({c.heads, c.rank, c.headdim}, kF64) * 0.5 + 1.0,
                 torch::randn({c.heads, c.rank, c.headdim}, kF64) * 0.3 + 0.5,
                 torch::randn({c.heads * c.headdim}, kF64) * 0.2 + 1.0};
  const auto ref = reference(in, gw);

  auto seq = ops::mamba3_preprocess(in.proj, in.weights, in.state.angle);
  // Phases on the circle (the op wraps them into [0, 2π)).
  EXPECT_LT((seq.final_angle - ref.angle).sin().abs().max().item<double>(), 1e-12);
  for (int64_t q : {0, 2, 4}) {  // 0: sequential; else chunked with that chunk size
    SCOPED_TRACE("chunk " + std::to_string(q));
    auto [y, state] = q == 0 ? ops::mamba3_scan_sequential(seq, in.state) : ops::mamba3_scan_chunked(seq, in.state, q);
    auto out = ops::mamba3_gate(y, gw.z, gw.mimo_z, gw.mimo_o, gw.norm, gw.eps);
    EXPECT_LT(max_rel_diff(out, ref.out), 1e-12);
    EXPECT_LT(max_rel_diff(state.ssm, ref.ssm), 1e-12);
    EXPECT_LT(max_rel_diff(state.k, ref.k), 1e-12);
  }
}

// Head h reads B/C group h / (H/G) (heads 0, 1 -> group 0; heads 2, 3 -> group 1: repeat_interleave, not repeat).
// With zero biases, unit gains and a zero phase the per-head query is exactly RMSNorm of its group's C.
TEST(Mamba3Reference, HeadsReadTheirGroupsInBlocks) {
  torch::set_num_threads(1);
  torch::manual_seed(12);
  const Mamba3Case c{1, 3, 4, 2, 6, 1, 2, 1};
  auto in = random_mamba3(c, torch::kDouble, /*fresh_state=*/true);
  in.proj.angle.zero_();  // θ = 0: with the zero start phase nothing turns
  in.weights.c_bias.zero_();
  in.weights.c_norm.fill_(1.0);
  in.weights.norm_eps = 0.0;
  auto seq = ops::mamba3_preprocess(in.proj, in.weights, in.state.angle);
  const std::vector<double> ones(c.d_state, 1.0);
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t group = h < 2 ? 0 : 1;
      std::vector<double> raw(c.d_state);
      for (int64_t n = 0; n < c.d_state; ++n) raw[n] = elem(in.proj.c, {0, t, 0, group, n});
      auto want = rms_normed(raw, ones, 0.0);
      for (int64_t n = 0; n < c.d_state; ++n)
        EXPECT_NEAR(elem(seq.q, {0, t, h, 0, n}), want[n], 1e-14) << "t " << t << " head " << h << " n " << n;
    }
}
