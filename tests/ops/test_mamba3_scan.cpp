// Mamba-3 math: the chunked form and the decode step against the sequential reference, continuation from a
// cached state, gradients, and one hand-computed SISO example that pins the discretisation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "ops/mamba3_fixture.h"
#include "slm/ops/mamba3_scan.h"
#include "slm/util/error.h"

using namespace slm;
using namespace slm::test;

namespace {

const Mamba3Case kSiso{2, 37, 4, 8, 10, 1, 2, 3};   // G = 2 groups over 4 heads, 3 of 5 pairs rotated
const Mamba3Case kMimo{2, 29, 4, 6, 8, 3, 2, 4};    // rank 3, every pair rotated

std::pair<torch::Tensor, ops::Mamba3State> run_sequential(const Mamba3Inputs& in) {
  return ops::mamba3_scan_sequential(ops::mamba3_preprocess(in.proj, in.weights, in.state.angle), in.state);
}

std::pair<torch::Tensor, ops::Mamba3State> run_chunked(const Mamba3Inputs& in, int64_t q) {
  return ops::mamba3_scan_chunked(ops::mamba3_preprocess(in.proj, in.weights, in.state.angle), in.state, q);
}

void expect_states_near(const ops::Mamba3State& a, const ops::Mamba3State& b, double tol) {
  EXPECT_LE(max_rel_diff(a.ssm, b.ssm), tol);
  EXPECT_LE(max_rel_diff(a.k, b.k), tol);
  EXPECT_LE(max_rel_diff(a.x, b.x), tol);
  // Phases are compared on the circle: the wrap at 2π may land on either side for a value next to it.
  EXPECT_LE((a.angle - b.angle).sin().abs().max().item<double>(), tol * 10);
}

void check_chunked_matches(const Mamba3Case& c, torch::Dtype dtype, double tol, bool fresh) {
  torch::manual_seed(1);
  auto in = random_mamba3(c, dtype, fresh);
  auto [y_ref, s_ref] = run_sequential(in);
  for (int64_t q : {1, 4, 8, 16, 64}) {  // 37 and 29 are multiples of none but 1
    SCOPED_TRACE("chunk " + std::to_string(q));
    auto [y, s] = run_chunked(in, q);
    EXPECT_LE(max_rel_diff(y, y_ref), tol);
    expect_states_near(s, s_ref, tol);
  }
}

}  // namespace

TEST(Mamba3Scan, ChunkedMatchesSequentialSisoFloat64) { check_chunked_matches(kSiso, torch::kDouble, 1e-9, false); }
TEST(Mamba3Scan, ChunkedMatchesSequentialMimoFloat64) { check_chunked_matches(kMimo, torch::kDouble, 1e-9, false); }
TEST(Mamba3Scan, ChunkedMatchesSequentialSisoFloat32) { check_chunked_matches(kSiso, torch::kFloat, 1e-4, true); }
TEST(Mamba3Scan, ChunkedMatchesSequentialMimoFloat32) { check_chunked_matches(kMimo, torch::kFloat, 1e-4, false); }

// Prefill in two calls (the second continuing from the first's state) == one call over everything, and the
// state after the two halves == the state after the whole.
TEST(Mamba3Scan, ChunkedContinuesFromState) {
  for (const auto& c : {kSiso, kMimo}) {
    torch::manual_seed(2);
    auto in = random_mamba3(c, torch::kDouble, true);
    auto [y_ref, s_ref] = run_sequential(in);
    const int64_t split = 13;
    auto first = ops::mamba3_preprocess(slice(in.proj, 0, split), in.weights, in.state.angle);
    auto [y1, s1] = ops::mamba3_scan_chunked(first, in.state, 8);
    auto second = ops::mamba3_preprocess(slice(in.proj, split, c.tokens - split), in.weights, s1.angle);
    auto [y2, s2] = ops::mamba3_scan_chunked(second, s1, 8);
    EXPECT_LE(max_rel_diff(torch::cat({y1, y2}, 1), y_ref), 1e-9);
    expect_states_near(s2, s_ref, 1e-9);
  }
}

// Token-by-token decode (preprocessing one token at a time on the carried phase) == the chunked prefill.
TEST(Mamba3Scan, DecodeStepsMatchChunked) {
  for (auto c : {kSiso, kMimo}) {
    c.tokens = 70;
    torch::manual_seed(3);
    auto in = random_mamba3(c, torch::kDouble, true);
    auto [y_ref, s_ref] = run_chunked(in, 16);
    auto state = in.state;
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < c.tokens; ++t) {
      auto step = ops::mamba3_preprocess(slice(in.proj, t, 1), in.weights, state.angle);
      auto [y, next] = ops::mamba3_step(step, state);
      ys.push_back(y);
      state = next;
    }
    EXPECT_LE(max_rel_diff(torch::cat(ys, 1), y_ref), 1e-9);
    expect_states_near(state, s_ref, 1e-9);
  }
}

// Autograd through the chunked form == autograd through the recurrence, for every input and parameter.
TEST(Mamba3Scan, ChunkedGradientsMatchSequential) {
  for (auto c : {kSiso, kMimo}) {
    c.tokens = 19;
    torch::manual_seed(4);
    auto in = random_mamba3(c, torch::kDouble, false, true);
    auto leaves = in.leaves();
    auto [y0, s0] = run_sequential(in);
    auto wy = torch::randn_like(y0), ws = torch::randn_like(s0.ssm), wk = torch::randn_like(s0.k);
    auto loss = [&](const torch::Tensor& y, const ops::Mamba3State& s) {
      return (y * wy).sum() + (s.ssm * ws).sum() + (s.k * wk).sum();
    };
    auto g_ref = torch::autograd::grad({loss(y0, s0)}, leaves);
    auto [y1, s1] = run_chunked(in, 8);
    auto g = torch::autograd::grad({loss(y1, s1)}, leaves);
    for (size_t i = 0; i < leaves.size(); ++i) {
      SCOPED_TRACE("leaf " + std::to_string(i));
      ASSERT_TRUE(g_ref[i].defined() && g[i].defined());
      EXPECT_LE(max_rel_diff(g[i], g_ref[i]), 1e-9);
    }
  }
}

// One SISO head, N = 2 (one rotated pair), P = 1, two tokens, values chosen so every quantity has a closed form:
//   token 0: Δ = ln 2, λ = 1/2, k = RMSNorm(3, 4) = (3, 4)/√12.5, q = RMSNorm(1, 0) = (√2, 0), φ = 0, x = 2
//   token 1: Δ = 1 (dd_dt = ln(e-1)), dd_A = -1 -> A = -1/(1+1) = -1/2 (heavy tail), α = e^{-1/2},
//            λ = 1/4 (trap = -ln 3) -> γ = 1/4, β = (3/4) e^{-1/2}; angle = atanh(1/2) -> θ = π/2, φ = π/2,
//            k = q = R(π/2)(0, √2) = (-√2, 0), x = 1.   D = 1/2.
//   y0 = γ0 x0 (k0·q0) + D x0 = (ln2/2)·2·1.2 + 1
//   S1 = α S0 + β x0 k0ᵀ + γ1 x1 k1ᵀ,  y1 = S1 q1 + D x1 = -1.2 e^{-1/2}(ln 2 + 3/2) + 1/2 + 1/2
TEST(Mamba3Scan, HandComputedSisoSteps) {
  auto o = torch::TensorOptions().dtype(torch::kDouble);
  ops::Mamba3Projections p;
  p.x = torch::tensor({2.0, 1.0}, o).view({1, 2, 1, 1});
  p.b = torch::tensor({3.0, 4.0, 0.0, 1.0}, o).view({1, 2, 1, 1, 2});
  p.c = torch::tensor({1.0, 0.0, 0.0, 1.0}, o).view({1, 2, 1, 1, 2});
  p.dd_dt = torch::tensor({0.0, std::log(std::exp(1.0) - 1.0)}, o).view({1, 2, 1});
  p.dd_a = torch::tensor({0.0, -1.0}, o).view({1, 2, 1});
  p.trap = torch::tensor({0.0, -std::log(3.0)}, o).view({1, 2, 1});
  p.angle = torch::tensor({0.0, std::atanh(0.5)}, o).view({1, 2, 1});
  ops::Mamba3Weights w;
  w.dt_bias = torch::tensor({std::log(1.0)}, o);  // softplus(0) = ln 2 for token 0
  w.b_bias = torch::zeros({1, 1, 2}, o);
  w.c_bias = torch::zeros({1, 1, 2}, o);
  w.b_norm = torch::ones({2}, o);
  w.c_norm = torch::ones({2}, o);
  w.d = torch::tensor({0.5}, o);
  w.norm_eps = 0.0;
  auto state = ops::mamba3_zero_state(1, 1, 1, 2, 1, 1, o);
  auto seq = ops::mamba3_preprocess(p, w, state.angle);

  const double ln2 = std::log(2.0), e = std::exp(-0.5);
  EXPECT_NEAR(seq.a[0][0][0].item<double>(), -ln2, 1e-12);
  EXPECT_NEAR(seq.a[0][1][0].item<double>(), -0.5, 1e-12);
  EXPECT_NEAR(seq.gamma[0][1][0].item<double>(), 0.25, 1e-12);
  EXPECT_NEAR(seq.eps[0][1][0].item<double>(), 0.75, 1e-12);
  EXPECT_NEAR(seq.final_angle.item<double>(), std::numbers::pi / 2, 1e-12);
  EXPECT_NEAR(seq.k[0][1][0][0][0].item<double>(), -std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(seq.k[0][1][0][0][1].item<double>(), 0.0, 1e-12);

  const double y0 = 1.2 * ln2 + 1.0, y1 = 1.0 - 1.2 * e * (ln2 + 1.5);
  for (int64_t q : {0, 1, 2}) {  // 0: sequential; else chunked with that chunk size
    auto [y, s] = q == 0 ? ops::mamba3_scan_sequential(seq, state) : ops::mamba3_scan_chunked(seq, state, q);
    EXPECT_NEAR(y[0][0][0][0][0].item<double>(), y0, 1e-12) << "chunk " << q;
    EXPECT_NEAR(y[0][1][0][0][0].item<double>(), y1, 1e-12) << "chunk " << q;
    // S1 = e^{-1/2}(ln 2 + 3/2) k0 + (1/4)(-√2, 0), k0 = (3, 4)/√12.5
    const double c0 = e * (ln2 + 1.5) / std::sqrt(12.5);
    EXPECT_NEAR(s.ssm[0][0][0][0].item<double>(), 3 * c0 - 0.25 * std::sqrt(2.0), 1e-12);
    EXPECT_NEAR(s.ssm[0][0][0][1].item<double>(), 4 * c0, 1e-12);
  }
}

TEST(Mamba3Scan, GateSisoIsYTimesSiluZ) {
  torch::manual_seed(5);
  auto y = torch::randn({2, 3, 4, 1, 5}), z = torch::randn({2, 3, 4, 5});
  auto out = ops::mamba3_gate(y, z, {}, {}, {}, 1e-5);
  EXPECT_TRUE(torch::allclose(out, (y.squeeze(3) * torch::silu(z)).flatten(2)));
}

TEST(Mamba3Scan, RejectsBadShapes) {
  torch::manual_seed(6);
  auto in = random_mamba3(kMimo, torch::kFloat, true);
  auto w = in.weights;
  w.mimo_x = torch::Tensor();
  EXPECT_THROW(ops::mamba3_preprocess(in.proj, w, in.state.angle), Error);
  auto seq = ops::mamba3_preprocess(in.proj, in.weights, in.state.angle);
  EXPECT_THROW(ops::mamba3_scan_chunked(seq, in.state, 0), Error);
  EXPECT_THROW(ops::mamba3_step(seq, in.state), Error);  // 29 tokens
}

// Packed documents (start flags): each document runs as the sequential reference runs it alone from a zero state
// (the row's first segment continues from the given state), in the sequential form, the chunked form at every
// chunk size (starts inside chunks, on a chunk boundary, one-token documents) and the final state.
TEST(Mamba3Scan, DocumentStartsRunEachDocumentAlone) {
  for (auto c : {kSiso, kMimo}) {
    c.tokens = 37;
    torch::manual_seed(6);
    auto in = random_mamba3(c, torch::kDouble);  // a mid-sequence state: the first segment continues it
    const std::vector<int64_t> starts = {5, 16, 17, 30};
    auto start = torch::zeros({c.batch, c.tokens}, torch::kBool);
    for (int64_t s : starts) start.select(1, s).fill_(true);
    start[1][0] = true;  // row 1 also starts a document at t = 0: its given state is dropped
    auto zero = ops::mamba3_zero_state(c.batch, c.heads, c.headdim, c.d_state, c.rank, c.angles, in.state.angle.options());
    std::vector<torch::Tensor> ys;
    ops::Mamba3State last;
    std::vector<int64_t> bounds = {0};
    bounds.insert(bounds.end(), starts.begin(), starts.end());
    bounds.push_back(c.tokens);
    for (size_t d = 0; d + 1 < bounds.size(); ++d) {
      const int64_t from = bounds[d], len = bounds[d + 1] - from;
      // Row 0's first segment continues the state; row 1's starts fresh.
      ops::Mamba3State st = zero;
      if (d == 0)
        for (auto [dst, src] : {std::pair{&st.angle, &in.state.angle}, {&st.ssm, &in.state.ssm}, {&st.k, &in.state.k},
                                {&st.x, &in.state.x}})
          *dst = torch::cat({src->narrow(0, 0, 1), dst->narrow(0, 1, 1)});
      auto seq = ops::mamba3_preprocess(slice(in.proj, from, len), in.weights, st.angle);
      auto [y, s] = ops::mamba3_scan_sequential(seq, st);
      ys.push_back(y);
      last = s;
    }
    auto y_ref = torch::cat(ys, 1);
    auto packed = ops::mamba3_preprocess(in.proj, in.weights, in.state.angle, start);
    auto [y_seq, s_seq] = ops::mamba3_scan_sequential(packed, in.state);
    EXPECT_LE(max_rel_diff(y_seq, y_ref), 1e-9);
    expect_states_near(s_seq, last, 1e-9);
    for (int64_t q : {1, 4, 8, 16, 64}) {
      SCOPED_TRACE("chunk " + std::to_string(q));
      auto [y, s] = ops::mamba3_scan_chunked(packed, in.state, q);
      EXPECT_LE(max_rel_diff(y, y_ref), 1e-9);
      expect_states_near(s, last, 1e-9);
    }
  }
}

// With document starts, autograd through the chunked form == autograd through the recurrence.
TEST(Mamba3Scan, DocumentStartsChunkedGradientsMatchSequential) {
  for (auto c : {kSiso, kMimo}) {
    c.tokens = 21;
    torch::manual_seed(7);
    auto in = random_mamba3(c, torch::kDouble, false, true);
    auto start = torch::zeros({c.batch, c.tokens}, torch::kBool);
    start.select(1, 6).fill_(true);
    start[0][8] = true;
    start[1][15] = true;
    auto leaves = in.leaves();
    auto run = [&](int64_t q) {
      auto seq = ops::mamba3_preprocess(in.proj, in.weights, in.state.angle, start);
      return q == 0 ? ops::mamba3_scan_sequential(seq, in.state) : ops::mamba3_scan_chunked(seq, in.state, q);
    };
    auto [y0, s0] = run(0);
    auto wy = torch::randn_like(y0), ws = torch::randn_like(s0.ssm);
    auto g_ref = torch::autograd::grad({(y0 * wy).sum() + (s0.ssm * ws).sum()}, leaves, {}, false, false, true);
    auto [y1, s1] = run(8);
    auto g = torch::autograd::grad({(y1 * wy).sum() + (s1.ssm * ws).sum()}, leaves, {}, false, false, true);
    for (size_t i = 0; i < leaves.size(); ++i) {
      SCOPED_TRACE("leaf " + std::to_string(i));
      ASSERT_EQ(g_ref[i].defined(), g[i].defined());
      if (g[i].defined()) {
        EXPECT_LE(max_rel_diff(g[i], g_ref[i]), 1e-9);
      }
    }
  }
}
