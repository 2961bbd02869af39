// The fused M2RNN CUDA scan against the libtorch reference run on the CPU in float64 (itself tested against
// autograd through the plain loop in test_m2rnn_scan.cpp): outputs, final state and every gradient, with document
// resets (also on stretch edges and at a row's first token), with and without the state-gradient clip, for each
// compiled value width, within what FP32 itself costs on the same inputs (expect_close below). Skipped without a
// GPU; runs on the GPU machine's full ctest.
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

// One run of the scan on given leaves: outputs, the gradients of a loss over y and the final state, and dW from y
// alone (no state-gradient source but y).
struct Run {
  torch::Tensor y, h;
  std::vector<torch::Tensor> grads;
  torch::Tensor dw_from_y;
};

Run run(const std::vector<torch::Tensor>& leaves, const torch::Tensor& reset, const Case& c, const torch::Tensor& wy,
        const torch::Tensor& wh) {
  std::vector<torch::Tensor> in;
  for (const auto& x : leaves) in.push_back(x.detach().clone().set_requires_grad(true));
  auto dev = [&](const torch::Tensor& x) { return x.defined() ? x.to(leaves[0].device()) : x; };
  auto [y, h] = ops::m2rnn_scan(in[0], in[1], in[2], in[3], in[4], in[5], in[6], c.clip, c.every, dev(reset));
  Run r{y.detach().cpu().to(torch::kDouble), h.detach().cpu().to(torch::kDouble), {}, {}};
  const auto wy_d = dev(wy).to(y.scalar_type()), wh_d = dev(wh).to(h.scalar_type());
  for (auto& g : torch::autograd::grad({(y * wy_d).sum() + (h * wh_d).sum()}, in, {}, true))
    r.grads.push_back(g.cpu().to(torch::kDouble));
  r.dw_from_y = torch::autograd::grad({(y * wy_d).sum()}, {in[4]})[0].cpu().to(torch::kDouble);
  return r;
}

// The kernels are held to what FP32 itself costs on these inputs: W = I + noise is expansive, so rounding grows
// along the sequence and, without the clip, more so backwards (the FP32 reference loop is up to ~1e-2 off float64
// on some gradients over 150 unclipped steps). Each quantity may be off float64 by ten times the error of the FP32
// reference loop on the CPU, and never less than 1e-5 (outputs) or 1e-4 (gradients); a wrong kernel is off by O(1).
void expect_close(const torch::Tensor& got, const torch::Tensor& ref, const torch::Tensor& fp32, double floor,
                  const std::string& what) {
  const double tol = std::max(floor, 10 * max_rel_diff(fp32, ref));
  EXPECT_LE(max_rel_diff(got, ref), tol) << what << " (FP32 reference: " << max_rel_diff(fp32, ref) << ")";
}

void check(const Case& c) {
  SCOPED_TRACE("K " + std::to_string(c.kd) + ", V " + std::to_string(c.vd) + ", T " + std::to_string(c.t) + ", every " +
               std::to_string(c.every) + ", clip " + std::to_string(c.clip) + (c.resets ? ", resets" : ""));
  auto leaves = random_inputs(c);
  auto reset = resets_for(c);
  // Large output weights so that the clip engages when it is on.
  auto wy = torch::randn({c.b, c.t, c.nh, c.vd}, torch::kDouble) * (c.clip > 0 ? 20.0 : 1.0);
  auto wh = torch::randn({c.b, c.nh, c.kd, c.vd}, torch::kDouble);
  std::vector<torch::Tensor> fp32, gpu;
  for (const auto& x : leaves) {
    fp32.push_back(x.to(torch::kFloat));
    gpu.push_back(x.to(torch::kCUDA, torch::kFloat));
  }
  ASSERT_TRUE(ops::m2rnn_fused(gpu[0], gpu[2], gpu[4], c.every)) << "the test would not run the kernels";
  const Run ref = run(leaves, reset, c, wy, wh), f32 = run(fp32, reset, c, wy, wh), got = run(gpu, reset, c, wy, wh);
  expect_close(got.y, ref.y, f32.y, 1e-5, "y");
  expect_close(got.h, ref.h, f32.h, 1e-5, "final state");
  const char* names[] = {"dq", "dk", "dv", "df", "dw", "dd", "dh0"};
  for (size_t i = 0; i < ref.grads.size(); ++i) expect_close(got.grads[i], ref.grads[i], f32.grads[i], 1e-4, names[i]);
  expect_close(got.dw_from_y, ref.dw_from_y, f32.dw_from_y, 1e-4, "dw from y alone");

  // Inference keeps no checkpoints and gives the same outputs.
  torch::NoGradGuard no_grad;
  auto [y_inf, h_inf] = ops::m2rnn_scan(gpu[0], gpu[1], gpu[2], gpu[3], gpu[4], gpu[5], gpu[6], c.clip, c.every,
                                        reset.defined() ? reset.cuda() : reset);
  expect_close(y_inf.cpu().to(torch::kDouble), ref.y, f32.y, 1e-5, "y without grad");
  expect_close(h_inf.cpu().to(torch::kDouble), ref.h, f32.h, 1e-5, "final state without grad");
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
  // Eight warps per CTA (the most rows per head) and one-token stretches: every backward stretch starts and ends
  // on its checkpoint, with resets on stretch edges.
  check({2, 33, 1, 256, 8, 1, 1.0, true});
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
  std::vector<torch::Tensor> fp32;
  for (const auto& x : ref) fp32.push_back(x.to(torch::kFloat));
  auto [y32, h32] =
      ops::m2rnn_scan(fp32[0], fp32[1], fp32[2], fp32[3], fp32[4], fp32[5], fp32[6], c.clip, c.every, resets_for(c));
  expect_close(y.cpu().to(torch::kDouble), y_ref, y32, 1e-5, "y");
  expect_close(h.cpu().to(torch::kDouble), h_ref, h32, 1e-5, "final state");
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
