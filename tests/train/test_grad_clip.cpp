// Gradient clipping (trainer.h): the DSA indexers' KL gradient is clipped apart from the LM's, so a huge indexer
// gradient leaves the LM update as it is; both against norms and clips computed here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

#include "model/model_test_util.h"
#include "slm/train/trainer.h"

using namespace slm;
using namespace slm::test;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// micro_ae (A E A) with DSA on both A layers (the indexer's KL is part of the loss in the Sparse stage).
nlohmann::json dsa_micro_json() {
  auto j = micro_ae_json();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_local_window"] = 2;
  j["attention"]["dsa_indexer_heads"] = 2;
  j["attention"]["dsa_indexer_dim"] = 4;
  return j;
}

// name -> a copy of the gradient (undefined gradients are absent).
std::map<std::string, torch::Tensor> gradients(model::HybridLM& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters())
    if (p.value().grad().defined()) out[p.key()] = p.value().grad().clone();
  return out;
}

bool is_indexer(const std::string& name) {
  return name.find(".attn.indexer.") != std::string::npos;
}

// sqrt(Σ g²) over the gradients of one side (indexer or LM), element by element.
double norm_of(const std::map<std::string, torch::Tensor>& grads, bool indexer) {
  double sq = 0;
  for (const auto& [name, g] : grads) {
    if (is_indexer(name) != indexer) continue;
    auto flat = g.contiguous().view({-1});
    for (int64_t i = 0; i < flat.size(0); ++i) sq += flat[i].item<double>() * flat[i].item<double>();
  }
  return std::sqrt(sq);
}

}  // namespace

TEST(GradClip, GroupsAreTheIndexersAndEverythingElse) {
  single_threaded();
  model::HybridLM m(parse(dsa_micro_json()), kF64);
  auto groups = train::clip_groups(m);
  size_t indexer = 0, total = 0;
  for (const auto& p : m.named_parameters()) {
    ++total;
    indexer += is_indexer(p.key());
  }
  EXPECT_EQ(groups.indexer.size(), indexer);
  EXPECT_EQ(indexer, 2u * 5u);  // wq, wk, k_norm weight and bias, weights_proj on both A layers
  EXPECT_EQ(groups.lm.size(), total - indexer);
}

// The indexer's gradient made 1e6 times larger (its KL scaled in the backward) changes neither the LM norm nor
// the clipped LM gradients: they are g·c/(‖g_LM‖ + 1e-6) as without it, and the indexers get their own clip.
TEST(GradClip, AHugeIndexerGradientLeavesTheLmGradientsAsTheyAre) {
  single_threaded();
  model::HybridLM m(parse(dsa_micro_json()), kF64);
  randomize(m, 51);
  m.train();
  auto tokens = random_tokens(2, 12, 13, 52), targets = random_tokens(2, 12, 13, 53);
  auto backward = [&](double indexer_scale) {
    for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
    auto out = m.loss(tokens, targets);
    ASSERT_GT(out.indexer.item<double>(), 0);
    (out.total + (indexer_scale - 1) * out.indexer).backward();
  };
  backward(1);
  const auto plain = gradients(m);
  backward(1e6);
  const auto huge = gradients(m);
  // The KL reaches the indexers only, so the LM gradients are the same and the indexers' grew.
  for (const auto& [name, g] : plain) {
    if (is_indexer(name)) continue;
    ASSERT_TRUE(huge.count(name)) << name;
    EXPECT_LT(max_abs_diff(huge.at(name), g), 1e-12 * (1 + g.abs().max().item<double>())) << name;
  }
  const double lm = norm_of(huge, false), indexer = norm_of(huge, true);
  ASSERT_NEAR(lm, norm_of(plain, false), 1e-10 * lm);
  ASSERT_GT(indexer, 1e4 * lm);

  const auto groups = train::clip_groups(m);
  const auto norms = train::grad_norms(groups);
  EXPECT_NEAR(norms.lm, lm, 1e-12 * lm);
  EXPECT_NEAR(norms.indexer, indexer, 1e-12 * indexer);
  const double c = 0.5 * lm;  // below both norms: both groups are clipped
  train::clip_gradients(groups, norms, c);
  const auto clipped = gradients(m);
  for (const auto& [name, g] : huge) {
    const double scale = c / ((is_indexer(name) ? indexer : lm) + 1e-6);
    EXPECT_LT(max_abs_diff(clipped.at(name), g * scale), 1e-12 * (1 + g.abs().max().item<double>() * scale)) << name;
  }
  EXPECT_NEAR(norm_of(clipped, false), c, 1e-5 * c);
  EXPECT_NEAR(norm_of(clipped, true), c, 1e-5 * c);

  // A clip above a group's norm leaves that group alone; 0 turns clipping off.
  backward(1e6);
  train::clip_gradients(groups, train::grad_norms(groups), 2 * lm);
  auto after = gradients(m);
  for (const auto& [name, g] : huge) {
    const double scale = is_indexer(name) ? 2 * lm / (indexer + 1e-6) : 1.0;
    EXPECT_LT(max_abs_diff(after.at(name), g * scale), 1e-12 * (1 + g.abs().max().item<double>())) << name;
  }
  backward(1e6);
  train::clip_gradients(groups, train::grad_norms(groups), 0);
  after = gradients(m);
  for (const auto& [name, g] : huge) EXPECT_TRUE(torch::equal(after.at(name), g)) << name;
}

// On CUDA the norms come from one multi-tensor launch (FP32 per tensor, summed in float64) and the clip scales with
// one: both against a float64 sum on the host.
TEST(GradClip, CudaNormsAndClipMatchAFloat64Sum) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(54);
  train::ClipGroups groups;
  double sq = 0;
  for (int64_t n : {3, 1000, 70000}) {
    auto p = torch::zeros({n}, torch::TensorOptions().device(torch::kCUDA)).requires_grad_();
    p.mutable_grad() = torch::randn({n}, p.options());
    sq += p.grad().to(torch::kCPU, torch::kDouble).pow(2).sum().item<double>();
    groups.lm.push_back(p);
  }
  const auto norms = train::grad_norms(groups);
  EXPECT_NEAR(norms.lm, std::sqrt(sq), 1e-6 * std::sqrt(sq));
  EXPECT_EQ(norms.indexer, 0.0);
  train::clip_gradients(groups, norms, 1.0);
  double after = 0;
  for (const auto& p : groups.lm) after += p.grad().to(torch::kCPU, torch::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(after), 1.0, 1e-5);
}
