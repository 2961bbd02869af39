// The LM head's loss: the reference path (CPU) and the fused CUDA kernels against a float64 loop over the rows
// (log Σ exp, the target's logit, the gradient softmax - onehot over the kept rows), and the model's loss under BF16
// autocast against the FP32 logits of its own forward.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "slm/model/hybrid_lm.h"
#include "slm/ops/cross_entropy.h"
#include "slm/recipe/recipe.h"
#include "slm/util/error.h"

using namespace slm;

namespace {

constexpr int64_t kIgnore = -1;

struct Expected {
  double loss;
  std::vector<double> grad;  // [rows * vocab], of the mean loss
};

// Independent of ATen's softmax: plain loops over the logits read as doubles.
Expected loop_reference(const torch::Tensor& logits, const torch::Tensor& targets) {
  auto x = logits.to(torch::kCPU, torch::kDouble).contiguous();
  auto t = targets.to(torch::kCPU).contiguous();
  const int64_t rows = x.size(0), vocab = x.size(1);
  const double* xp = x.data_ptr<double>();
  const int64_t* tp = t.data_ptr<int64_t>();
  Expected e{0.0, std::vector<double>(rows * vocab, 0.0)};
  int64_t kept = 0;
  for (int64_t r = 0; r < rows; ++r) kept += tp[r] != kIgnore;
  for (int64_t r = 0; r < rows; ++r) {
    if (tp[r] == kIgnore) continue;
    const double* row = xp + r * vocab;
    double mx = row[0];
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
    double s = 0;
    for (int64_t j = 0; j < vocab; ++j) s += std::exp(row[j] - mx);
    const double lse = mx + std::log(s);
    e.loss += (lse - row[tp[r]]) / static_cast<double>(kept);
    for (int64_t j = 0; j < vocab; ++j)
      e.grad[r * vocab + j] = (std::exp(row[j] - lse) - (j == tp[r] ? 1.0 : 0.0)) / static_cast<double>(kept);
  }
  return e;
}

torch::Tensor random_targets(int64_t rows, int64_t vocab, std::vector<int64_t> ignored) {
  auto t = torch::randint(vocab, {rows}, torch::kLong);
  for (auto r : ignored) t[r] = kIgnore;
  t[1] = vocab - 1;  // the last column, the end of a vector pack
  return t;
}

// loss * weight backpropagated: the gradient must carry the upstream factor too.
void check(const torch::Tensor& logits_in, const torch::Tensor& targets, double loss_tol, double grad_tol) {
  const double weight = 0.37;
  auto logits = logits_in.detach().clone().set_requires_grad(true);
  auto loss = ops::cross_entropy(logits, targets.to(logits.device()), kIgnore);
  (loss * weight).backward();
  const auto e = loop_reference(logits_in, targets);
  EXPECT_NEAR(loss.item<double>(), e.loss, loss_tol * std::max(1.0, std::abs(e.loss)));
  auto g = logits.grad().to(torch::kCPU, torch::kDouble).contiguous();
  ASSERT_EQ(g.scalar_type(), torch::kDouble);
  EXPECT_EQ(logits.grad().scalar_type(), logits_in.scalar_type());  // written in the logits' own type
  const double* gp = g.data_ptr<double>();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < e.grad.size(); ++i) {
    worst = std::max(worst, std::abs(gp[i] - weight * e.grad[i]));
    scale = std::max(scale, std::abs(weight * e.grad[i]));
  }
  EXPECT_LE(worst, grad_tol * scale) << "max |grad - reference| " << worst << " of max " << scale;
}

}  // namespace

TEST(CrossEntropy, ReferenceMatchesTheLoopWithIgnoredRows) {
  torch::manual_seed(1);
  auto logits = torch::randn({9, 50}, torch::kDouble) * 3;
  check(logits, random_targets(9, 50, {0, 4}), 1e-12, 1e-12);
  check(logits.to(torch::kFloat), random_targets(9, 50, {3}), 1e-6, 1e-5);
}

TEST(CrossEntropy, RejectsBadShapes) {
  auto logits = torch::randn({4, 10});
  EXPECT_THROW(ops::cross_entropy(logits.view({2, 2, 10}), torch::zeros({4}, torch::kLong), kIgnore), Error);
  EXPECT_THROW(ops::cross_entropy(logits, torch::zeros({3}, torch::kLong), kIgnore), Error);
  EXPECT_THROW(ops::cross_entropy(logits, torch::zeros({4}, torch::kInt), kIgnore), Error);
  EXPECT_FALSE(ops::cross_entropy_fused(logits));  // CPU logits take the reference
}

TEST(CrossEntropyCuda, FusedKernelsMatchTheLoop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(2);
  // A 32k vocabulary (the 16-byte packs) and an odd one (the per-element path), BF16 and FP32, ignored rows, logits
  // spread wide enough that the row maxima matter.
  for (int64_t vocab : {32768, 1001}) {
    for (auto type : {torch::kBFloat16, torch::kFloat}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + (type == torch::kFloat ? " fp32" : " bf16"));
      auto logits = (torch::randn({70, vocab}) * 4).to(torch::kCUDA, type);
      ASSERT_TRUE(ops::cross_entropy_fused(logits));
      // The reference reads the same (rounded) logits; what differs is FP32 accumulation and, in BF16, the
      // rounding of the gradient itself (2^-8 relative).
      check(logits, random_targets(70, vocab, {5, 69}), 1e-5, type == torch::kFloat ? 1e-5 : 8e-3);
    }
  }
}

TEST(CrossEntropyCuda, AllRowsIgnoredGivesNaNAsTorchDoes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto logits = torch::randn({3, 64}, torch::kCUDA).to(torch::kBFloat16);
  auto t = torch::full({3}, kIgnore, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
  EXPECT_TRUE(std::isnan(ops::cross_entropy(logits, t, kIgnore).item<double>()));
  EXPECT_TRUE(std::isnan(
      torch::nn::functional::cross_entropy(logits.to(torch::kFloat), t,
                                           torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnore))
          .item<double>()));
}

TEST(CrossEntropyCuda, ModelLossUnderAutocastMatchesItsFP32Logits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(3);
  auto r = parse_recipe_text(R"({"name": "ce", "vocab_size": 512, "d_model": 64, "depth": 2, "pattern": "AF",
    "mlp": {"hidden": 128}, "attention": {"heads": 2, "kv_heads": 1, "head_dim": 32},
    "mtp": {"depth": 1, "lambda": 0.5, "pattern": "AF"}, "seq_len": 64})",
                             "test");
  model::HybridLM m(r, torch::TensorOptions().device(torch::kCUDA));
  {
    torch::NoGradGuard no_grad;
    m.lm_head->weight.dense().normal_(0.0, 0.2);  // away from the near-uniform start, so that the targets matter
  }
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA);
  auto x = torch::randint(512, {2, 33}, opts);
  auto tokens = x.narrow(1, 0, 32), targets = x.narrow(1, 1, 32);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  auto out = m.loss(tokens, targets);
  auto fwd = m.forward(tokens);  // FP32 logits of the same BF16 head output
  auto mtp = m.mtp_logits(tokens, fwd.hidden);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  ASSERT_EQ(fwd.logits.scalar_type(), torch::kFloat);
  const auto main = loop_reference(fwd.logits.reshape({-1, 512}), targets.reshape({-1}));
  const auto ahead = loop_reference(mtp[0].reshape({-1, 512}), targets.narrow(1, 1, 31).reshape({-1}));
  EXPECT_NEAR(out.main.item<double>(), main.loss, 1e-5 * main.loss);
  ASSERT_EQ(out.mtp.size(), 1u);
  EXPECT_NEAR(out.mtp[0].item<double>(), ahead.loss, 1e-5 * ahead.loss);
  out.total.backward();  // the fused backward runs inside the model's graph
  EXPECT_TRUE(m.lm_head->weight.dense().grad().defined());
  EXPECT_TRUE(torch::isfinite(m.lm_head->weight.dense().grad()).all().item<bool>());
}
