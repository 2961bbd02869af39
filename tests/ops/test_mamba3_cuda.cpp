// The fused Mamba-3 CUDA scan (ops::mamba3_scan_fused) against the float64 reference on the CPU
// (mamba3_preprocess + mamba3_scan_sequential, itself tested against hand-computed steps in test_mamba3_scan.cpp):
// outputs, the carried state and the gradients of every input, parameter and state tensor, with packed documents
// (starts inside chunks, on chunk edges and at a row's first token), groups shared by heads, a partial last chunk
// and a mid-sequence initial state, for every compiled SISO head shape and MIMO of rank 2 and 4 (whose chunks hold
// 16 and 8 tokens, so the same starts fall inside chunks and on their edges); within ten times what FP32 itself costs
// on the same inputs. Skipped without a GPU; runs on the GPU machine's full ctest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/mamba3_fixture.h"
#include "slm/ops/mamba3_scan.h"
#include "slm/util/error.h"

using namespace slm;
using namespace slm::test;

namespace {

struct Case {
  Mamba3Case shape;
  bool fresh_state, starts;
};

torch::Tensor starts_for(const Case& c) {
  if (!c.starts) return {};
  const int64_t b = c.shape.batch, t = c.shape.tokens;
  auto start = torch::zeros({b, t}, torch::kBool);
  // Inside a chunk, on a chunk's first token, one after it, the last token of a chunk, and a row's first token.
  for (int64_t p : {5, 32, 33, 63, 64})
    if (p < t) start[0][p] = true;
  if (b > 1) start[1][0] = true;
  if (b > 1 && t > 40) start[1][40] = true;
  return start;
}

struct Run {
  torch::Tensor y, ssm, k, x, angle;
  std::vector<torch::Tensor> grads;
};

// Leaves on their device and dtype; `fused` picks the kernels, otherwise the sequential reference runs.
Run run(const Mamba3Inputs& leaves, const torch::Tensor& start, bool fused, const std::vector<torch::Tensor>& w) {
  auto in = leaves;  // shallow: re-leaf every tensor so that each run has its own gradients
  std::vector<torch::Tensor*> all = {&in.proj.x,         &in.proj.b,         &in.proj.c,         &in.proj.dd_dt,
                                     &in.proj.dd_a,      &in.proj.trap,      &in.proj.angle,     &in.weights.dt_bias,
                                     &in.weights.b_bias, &in.weights.c_bias, &in.weights.b_norm, &in.weights.c_norm,
                                     &in.weights.d,      &in.state.angle,    &in.state.ssm,      &in.state.k,
                                     &in.state.x};
  if (in.weights.mimo_x.defined()) all.push_back(&in.weights.mimo_x);
  std::vector<torch::Tensor> vars;
  for (auto* t : all) {
    *t = t->detach().clone().set_requires_grad(true);
    vars.push_back(*t);
  }
  const auto dev = in.proj.x.device();
  const auto st = start.defined() ? start.to(dev) : start;
  std::pair<torch::Tensor, ops::Mamba3State> out;
  if (fused) {
    EXPECT_TRUE(ops::mamba3_fused(in.proj, in.weights)) << "the test would not run the kernels";
    out = ops::mamba3_scan_fused(in.proj, in.weights, in.state, st);
  } else {
    out = ops::mamba3_scan_sequential(ops::mamba3_preprocess(in.proj, in.weights, in.state.angle, st), in.state);
  }
  const auto& [y, s] = out;
  auto f64 = [](const torch::Tensor& t) { return t.detach().cpu().to(torch::kDouble); };
  Run r{f64(y), f64(s.ssm), f64(s.k), f64(s.x), f64(s.angle), {}};
  auto dw = [&](size_t i, const torch::Tensor& t) { return w[i].to(t.device(), t.scalar_type()); };
  auto loss = (y * dw(0, y)).sum() + (s.ssm * dw(1, s.ssm)).sum() + (s.k * dw(2, s.k)).sum() +
              (s.x * dw(3, s.x)).sum() + (s.angle * dw(4, s.angle)).sum();
  for (auto& g : torch::autograd::grad({loss}, vars, {}, false, false, true))
    r.grads.push_back(g.defined() ? f64(g) : torch::zeros({1}, torch::kDouble));
  return r;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& ref, const torch::Tensor& fp32, double floor,
                  const std::string& what) {
  const double tol = std::max(floor, 10 * max_rel_diff(fp32, ref));
  EXPECT_LE(max_rel_diff(got, ref), tol) << what << " (FP32 reference: " << max_rel_diff(fp32, ref) << ")";
}

Mamba3Inputs converted(const Mamba3Inputs& in, torch::Device dev, torch::Dtype proj_dtype) {
  auto to = [&](const torch::Tensor& t, torch::Dtype d) { return t.detach().to(dev, d); };
  Mamba3Inputs out;
  const auto& p = in.proj;
  out.proj = {to(p.x, proj_dtype),    to(p.b, proj_dtype),    to(p.c, proj_dtype),    to(p.dd_dt, proj_dtype),
              to(p.dd_a, proj_dtype), to(p.trap, proj_dtype), to(p.angle, proj_dtype)};
  const auto& w = in.weights;
  out.weights = {to(w.dt_bias, torch::kFloat),
                 to(w.b_bias, torch::kFloat),
                 to(w.c_bias, torch::kFloat),
                 to(w.b_norm, torch::kFloat),
                 to(w.c_norm, torch::kFloat),
                 w.mimo_x.defined() ? to(w.mimo_x, torch::kFloat) : torch::Tensor(),
                 to(w.d, torch::kFloat),
                 w.a_floor,
                 w.norm_eps};
  const auto& s = in.state;
  out.state = {to(s.angle, torch::kFloat), to(s.ssm, torch::kFloat), to(s.k, torch::kFloat), to(s.x, torch::kFloat)};
  return out;
}

void check(const Case& c) {
  const auto& m = c.shape;
  SCOPED_TRACE("P " + std::to_string(m.headdim) + ", N " + std::to_string(m.d_state) + ", R " + std::to_string(m.rank) +
               ", T " + std::to_string(m.tokens) + ", G " + std::to_string(m.groups) +
               (c.fresh_state ? ", fresh" : ", carried") + (c.starts ? ", documents" : ""));
  const auto ref_in = random_mamba3(m, torch::kDouble, c.fresh_state);
  const auto start = starts_for(c);
  const auto y_shape = std::vector<int64_t>{m.batch, m.tokens, m.heads, m.rank, m.headdim};
  const std::vector<torch::Tensor> w = {torch::randn(y_shape, torch::kDouble),
                                        torch::randn({m.batch, m.heads, m.headdim, m.d_state}, torch::kDouble),
                                        torch::randn({m.batch, m.heads, m.rank, m.d_state}, torch::kDouble),
                                        torch::randn({m.batch, m.heads, m.headdim}, torch::kDouble),
                                        torch::randn({m.batch, m.heads, m.angles}, torch::kDouble)};
  const Run ref = run(ref_in, start, false, w);
  const Run f32 = run(converted(ref_in, torch::kCPU, torch::kFloat), start, false, w);
  const Run got = run(converted(ref_in, torch::kCUDA, torch::kFloat), start, true, w);
  expect_close(got.y, ref.y, f32.y, 1e-5, "y");
  expect_close(got.ssm, ref.ssm, f32.ssm, 1e-5, "final state");
  expect_close(got.k, ref.k, f32.k, 1e-5, "final key");
  expect_close(got.x, ref.x, f32.x, 1e-6, "final x");
  expect_close(got.angle, ref.angle, f32.angle, 1e-6, "final angle");
  const char* names[] = {"dx",          "dB",        "dC",        "d dd_dt",  "d dd_A",   "d trap", "d angle",
                         "d dt_bias",   "d B_bias",  "d C_bias",  "d B_norm", "d C_norm", "dD",     "d state angle",
                         "d state ssm", "d state k", "d state x", "d mimo_x"};
  ASSERT_EQ(ref.grads.size(), std::size(names) - (m.rank == 1 ? 1 : 0));
  for (size_t i = 0; i < ref.grads.size(); ++i) expect_close(got.grads[i], ref.grads[i], f32.grads[i], 1e-4, names[i]);
}

}  // namespace

TEST(Mamba3Cuda, FusedScanMatchesTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(41);
  // hybrid-250m's head (P 64, N 128, half the pairs rotated) with a partial last chunk, documents, shared groups.
  check({{2, 100, 4, 64, 128, 1, 2, 32}, true, true});
  check({{2, 100, 4, 64, 128, 1, 1, 32}, false, false});
  check({{2, 70, 2, 64, 64, 1, 1, 16}, false, true});  // the small specialist's head
  check({{1, 45, 2, 32, 128, 1, 2, 64}, true, true});  // every pair rotated
  check({{2, 33, 2, 32, 64, 1, 1, 8}, false, false});
  check({{1, 64, 3, 64, 32, 1, 3, 4}, true, true});
  check({{1, 40, 2, 32, 32, 1, 1, 16}, false, true});
}

// MIMO: rank 4 chunks are 8 tokens and rank 2 ones 16, so starts_for's documents begin inside chunks (5, 33, 63) and
// on their first tokens (32, 40, 64), and no T below is a multiple of the chunk. Tolerances as above: the kernels
// and the FP32 reference round alike, the ranks only add terms to the same sums.
TEST(Mamba3Cuda, FusedMimoScanMatchesTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(43);
  // nam56r's head (P 64, N 128, rank 4, half the pairs rotated), 2 heads per group.
  check({{2, 100, 4, 64, 128, 4, 2, 32}, true, true});
  check({{2, 100, 4, 64, 128, 4, 2, 32}, false, false});
  check({{2, 70, 4, 64, 64, 2, 2, 16}, false, true});
  check({{1, 45, 2, 32, 128, 2, 1, 64}, true, true});   // every pair rotated
  check({{2, 37, 4, 32, 64, 4, 4, 8}, false, true});    // a group per head
  check({{1, 30, 8, 64, 128, 4, 8, 32}, false, true});  // nam56r's 8 groups
}

namespace {

void check_bf16(const Mamba3Case& m) {
  SCOPED_TRACE("R " + std::to_string(m.rank));
  const auto in = random_mamba3(m, torch::kDouble, true);
  // The projections arrive in BF16 under autocast; the reference sees the same rounded values in float64.
  const auto bf16 = converted(in, torch::kCUDA, torch::kBFloat16);
  auto ref = converted(in, torch::kCPU, torch::kBFloat16);
  auto f64 = [](torch::Tensor& t) { t = t.to(torch::kDouble); };
  for (auto* t : {&ref.proj.x, &ref.proj.b, &ref.proj.c, &ref.proj.dd_dt, &ref.proj.dd_a, &ref.proj.trap,
                  &ref.proj.angle, &ref.weights.dt_bias, &ref.weights.b_bias, &ref.weights.c_bias, &ref.weights.b_norm,
                  &ref.weights.c_norm, &ref.weights.d, &ref.state.angle, &ref.state.ssm, &ref.state.k, &ref.state.x})
    f64(*t);
  if (ref.weights.mimo_x.defined()) f64(ref.weights.mimo_x);
  auto [y, s] = ops::mamba3_scan_fused(bf16.proj, bf16.weights, bf16.state);
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  auto [y_ref, s_ref] =
      ops::mamba3_scan_sequential(ops::mamba3_preprocess(ref.proj, ref.weights, ref.state.angle), ref.state);
  EXPECT_LE(max_rel_diff(y.cpu(), y_ref), 1e-4);
  EXPECT_LE(max_rel_diff(s.ssm.cpu(), s_ref.ssm), 1e-4);
}

}  // namespace

TEST(Mamba3Cuda, BF16ProjectionsRunTheKernelsInFP32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(42);
  check_bf16({2, 80, 4, 64, 128, 1, 1, 32});
  check_bf16({2, 80, 4, 64, 128, 4, 2, 32});  // MIMO
}

TEST(Mamba3Cuda, UnsupportedLayersStayOnTheReference) {
  const auto cpu = random_mamba3({1, 8, 2, 64, 128, 1, 1, 32}, torch::kFloat, true);
  EXPECT_FALSE(ops::mamba3_fused(cpu.proj, cpu.weights)) << "CPU tensors";
  EXPECT_THROW(ops::mamba3_scan_fused(cpu.proj, cpu.weights, cpu.state), Error);
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto ok = converted(cpu, torch::kCUDA, torch::kFloat);
  EXPECT_TRUE(ops::mamba3_fused(ok.proj, ok.weights));
  EXPECT_FALSE(ops::mamba3_fused(converted(cpu, torch::kCUDA, torch::kDouble).proj, ok.weights)) << "float64";
  const auto odd =
      converted(random_mamba3({1, 8, 2, 48, 128, 1, 1, 32}, torch::kFloat, true), torch::kCUDA, torch::kFloat);
  EXPECT_FALSE(ops::mamba3_fused(odd.proj, odd.weights)) << "headdim 48";
  auto mimo = [](int64_t d_state, int64_t rank) {
    return converted(random_mamba3({1, 8, 2, 64, d_state, rank, 1, 8}, torch::kFloat, true), torch::kCUDA,
                     torch::kFloat);
  };
  const auto rank2 = mimo(128, 2), rank8 = mimo(128, 8), narrow = mimo(32, 2);
  EXPECT_TRUE(ops::mamba3_fused(rank2.proj, rank2.weights)) << "MIMO rank 2";
  EXPECT_FALSE(ops::mamba3_fused(rank8.proj, rank8.weights)) << "MIMO rank 8";
  EXPECT_FALSE(ops::mamba3_fused(narrow.proj, narrow.weights)) << "MIMO d_state 32";
  EXPECT_FALSE(ops::mamba3_fused(rank2.proj, ok.weights)) << "rank 2 without mimo_x";
}
