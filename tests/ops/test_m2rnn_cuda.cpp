// The fused M2RNN CUDA scan against the libtorch reference run on the CPU in float64 (itself tested against
// autograd through the plain loop in test_m2rnn_scan.cpp): outputs, final state and every gradient, with document
// resets (also on stretch edges and at a row's first token), with and without the state-gradient clip, for each
// compiled value width. FP32 kernels: outputs within state_tolerance below, gradients within 2e-4 relative (150
// steps of FP32 accumulation against float64). Skipped without a GPU; runs on the GPU machine's full ctest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/mamba3_fixture.h"
#include "slm/ops/m2rnn_scan.h"

using namespace slm;
using namespace slm::test;

namespace {

struct Case {
  int64_t b, t, nh, kd, vd, every;
  double clip;
  bool resets;
};

std::vector<torch::Tensor> random_inputs(const Case& c) {
  auto o = torch::TensorOptions().dtype(torch::kDouble);
  return {torch::randn({c.b, c.t, c.nh, c.kd}, o),
          torch::randn({c.b, c.t, c.nh, c.kd}, o) * 0.5,
          torch::randn({c.b, c.t, c.nh, c.vd}, o),
          torch::rand({c.b, c.t, c.nh}, o) * 0.8 + 0.1,
          torch::eye(c.vd, o).expand({c.nh, c.vd, c.vd}) + 0.3 * torch::randn({c.nh, c.vd, c.vd}, o),
          torch::randn({c.nh, c.vd}, o),
          torch::tanh(torch::randn({c.b, c.nh, c.kd, c.vd}, o))};
}

torch::Tensor resets_for(const Case& c) {
  if (!c.resets) return {};
  auto reset = torch::zeros({c.b, c.t}, torch::kBool);
  // Inside a stretch, on a stretch's first token, one after it, and the very first token of a row (which then
  // ignores h0).
  for (int64_t p : {int64_t{5}, c.every, c.every + 1, 2 * c.every - 1})
    if (p < c.t) reset[0][p] = true;
  if (c.b > 1) reset[1][0] = true;
  if (c.b > 1 && c.t > 40) reset[1][40] = true;
  return reset;
}

// Outputs may differ from float64 by what FP32 itself costs on these inputs: W = I + noise is expansive, so rounding
// grows along the sequence (measured up to ~4e-5 relative on the final state over 64-150 steps). The bound is ten
// times the error of the FP32 reference loop on the CPU, and never below 1e-5; a wrong kernel is off by O(1).
double state_tolerance(const std::vector<torch::Tensor>& in, const torch::Tensor& reset, const Case& c,
                       const torch::Tensor& y_ref, const torch::Tensor& h_ref) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> f;
  for (const auto& x : in) f.push_back(x.to(torch::kFloat));
  auto [y, h] = ops::m2rnn_scan(f[0], f[1], f[2], f[3], f[4], f[5], f[6], c.clip, c.every, reset);
  return std::max(1e-5, 10 * std::max(max_rel_diff(y, y_ref), max_rel_diff(h, h_ref)));
}

void check(const Case& c) {
  SCOPED_TRACE("K " + std::to_string(c.kd) + ", V " + std::to_string(c.vd) + ", T " + std::to_string(c.t) + ", every " +
               std::to_string(c.every) + ", clip " + std::to_string(c.clip) + (c.resets ? ", resets" : ""));
  auto leaves = random_inputs(c);
  auto reset = resets_for(c);
  // Large output weights so that the clip engages when it is on.
  auto wy = torch::randn({c.b, c.t, c.nh, c.vd}, torch::kDouble) * (c.clip > 0 ? 20.0 : 1.0);
  auto wh = torch::randn({c.b, c.nh, c.kd, c.vd}, torch::kDouble);

  std::vector<torch::Tensor> ref_in, gpu_in;
  for (auto& x : leaves) {
    ref_in.push_back(x.clone().set_requires_grad(true));
    gpu_in.push_back(x.to(torch::kCUDA, torch::kFloat).set_requires_grad(true));
  }
  ASSERT_TRUE(ops::m2rnn_fused(gpu_in[0], gpu_in[2], gpu_in[4], c.every)) << "the test would not run the kernels";
  auto [y_ref, h_ref] = ops::m2rnn_scan(ref_in[0], ref_in[1], ref_in[2], ref_in[3], ref_in[4], ref_in[5], ref_in[6],
                                        c.clip, c.every, reset);
  auto [y, h] = ops::m2rnn_scan(gpu_in[0], gpu_in[1], gpu_in[2], gpu_in[3], gpu_in[4], gpu_in[5], gpu_in[6], c.clip,
                                c.every, reset.defined() ? reset.cuda() : reset);
  ASSERT_TRUE(y.is_cuda());
  const double tol = state_tolerance(leaves, reset, c, y_ref, h_ref);
  EXPECT_LE(max_rel_diff(y.cpu(), y_ref), tol);
  EXPECT_LE(max_rel_diff(h.cpu(), h_ref), tol);

  auto g_ref = torch::autograd::grad({(y_ref * wy).sum() + (h_ref * wh).sum()}, ref_in, {}, true);
  auto g = torch::autograd::grad({(y * wy.cuda()).sum() + (h * wh.cuda()).sum()}, gpu_in, {}, true);
  const char* names[] = {"q", "k", "v", "f", "w", "d", "h0"};
  for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(max_rel_diff(g[i].cpu(), g_ref[i]), 2e-4) << "d" << names[i];

  // Without any state-gradient source but y (the final state unused), and in inference (no checkpoints kept).
  auto g_y = torch::autograd::grad({(y * wy.cuda()).sum()}, {gpu_in[4]});
  auto g_y_ref = torch::autograd::grad({(y_ref * wy).sum()}, {ref_in[4]});
  EXPECT_LE(max_rel_diff(g_y[0].cpu(), g_y_ref[0]), 2e-4) << "dw from y alone";
  torch::NoGradGuard no_grad;
  auto [y_inf, h_inf] = ops::m2rnn_scan(gpu_in[0], gpu_in[1], gpu_in[2], gpu_in[3], gpu_in[4], gpu_in[5], gpu_in[6],
                                        c.clip, c.every, reset.defined() ? reset.cuda() : reset);
  EXPECT_LE(max_rel_diff(y_inf.cpu(), y_ref), tol);
  EXPECT_LE(max_rel_diff(h_inf.cpu(), h_ref), tol);
}

}  // namespace

TEST(M2rnnCuda, FusedScanMatchesTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(31);
  // hybrid-250m's state shape (K 64, V 16, stretches of 64) with a partial last stretch.
  for (double clip : {0.0, 1.0})
    for (bool resets : {false, true}) check({2, 150, 3, 64, 16, 64, clip, resets});
  for (int64_t vd : {4, 8, 32}) check({2, 45, 2, 32, vd, 16, 1.0, true});
  check({1, 70, 2, 96, 16, 8, 0.0, true});  // three warps per CTA, many short stretches
}

TEST(M2rnnCuda, BF16InputsRunTheKernelsInFP32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(32);
  Case c{2, 64, 2, 64, 16, 64, 1.0, true};
  auto in = random_inputs(c);
  std::vector<torch::Tensor> bf16, ref;
  for (size_t i = 0; i < in.size(); ++i) {
    // The projections arrive in BF16 under autocast; the parameters (w, d) and the state stay FP32.
    const bool param = i == 4 || i == 5 || i == 6;
    bf16.push_back(in[i].to(torch::kCUDA, param ? torch::kFloat : torch::kBFloat16));
    ref.push_back(bf16.back().to(torch::kCPU, torch::kDouble));  // the same rounded values, in float64
  }
  ASSERT_TRUE(ops::m2rnn_fused(bf16[0], bf16[2], bf16[4], c.every));
  auto [y, h] = ops::m2rnn_scan(bf16[0], bf16[1], bf16[2], bf16[3], bf16[4], bf16[5], bf16[6], c.clip, c.every,
                                resets_for(c).cuda());
  auto [y_ref, h_ref] =
      ops::m2rnn_scan(ref[0], ref[1], ref[2], ref[3], ref[4], ref[5], ref[6], c.clip, c.every, resets_for(c));
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  const double tol = state_tolerance(ref, resets_for(c), c, y_ref, h_ref);
  EXPECT_LE(max_rel_diff(y.cpu(), y_ref), tol);
  EXPECT_LE(max_rel_diff(h.cpu(), h_ref), tol);
}

TEST(M2rnnCuda, UnsupportedShapesStayOnTheReference) {
  auto o = torch::TensorOptions().dtype(torch::kFloat);
  auto q = torch::zeros({1, 4, 2, 64}, o), v = torch::zeros({1, 4, 2, 16}, o), w = torch::zeros({2, 16, 16}, o);
  EXPECT_FALSE(ops::m2rnn_fused(q, v, w, 64)) << "CPU tensors";
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(ops::m2rnn_fused(q.cuda(), v.cuda(), w.cuda(), 64));
  EXPECT_FALSE(ops::m2rnn_fused(q.cuda().to(torch::kDouble), v.cuda(), w.cuda(), 64)) << "float64";
  EXPECT_FALSE(ops::m2rnn_fused(q.cuda().narrow(3, 0, 40), v.cuda(), w.cuda(), 64)) << "K not a multiple of 32";
  EXPECT_FALSE(ops::m2rnn_fused(q.cuda(), v.cuda().narrow(3, 0, 12), w.cuda(), 64)) << "V 12";
  EXPECT_FALSE(ops::m2rnn_fused(q.cuda(), v.cuda(), w.cuda(), 4096)) << "a stretch too long for shared memory";
}
