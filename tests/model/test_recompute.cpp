// Activation checkpointing (slm/model/recompute.h): a recomputed block gives the gradients of the plain block and
// really runs twice; a whole hybrid model (attention, Mamba-3, M2RNN and MLP blocks recomputed; MoE and the rest not)
// gives the plain model's loss and every parameter's gradient, in float64, with packed documents.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "model_test_util.h"
#include "slm/model/recompute.h"

using namespace slm;
using namespace slm::test;

namespace {

// Nodes of the backward graph whose name contains `what`.
int count_nodes(const torch::Tensor& root, const std::string& what) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{root.grad_fn().get()};
  int n = 0;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    n += node->name().find(what) != std::string::npos;
    for (const auto& e : node->next_edges()) todo.push_back(e.function.get());
  }
  return n;
}

TEST(Recompute, ABlockRunsAgainInTheBackwardAndGivesThePlainGradients) {
  torch::manual_seed(3);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  auto w1 = torch::randn({6, 5}, f64).requires_grad_(true);
  auto w2 = torch::randn({5, 6}, f64).requires_grad_(true);
  auto x0 = torch::randn({4, 6}, f64);
  int calls = 0;
  auto block = [&](const torch::Tensor& x) {
    ++calls;
    return torch::tanh(x.matmul(w1)).matmul(w2);
  };
  auto run = [&](bool checkpoint) {
    w1.mutable_grad() = torch::Tensor();
    w2.mutable_grad() = torch::Tensor();
    auto x = (x0 * 1.5).detach().requires_grad_(true);
    auto h = x * 2;  // x reaches the block through an op, as the residual stream does
    auto y = checkpoint ? model::recompute(h, block) : block(h);
    (y * y).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w1.grad(), w2.grad()};
  };
  const auto plain = run(false);
  calls = 0;
  const auto ckpt = run(true);
  EXPECT_EQ(calls, 2) << "once in the forward, once in the backward";
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(ckpt[i].defined()) << i;
    EXPECT_TRUE(torch::equal(ckpt[i], plain[i])) << "output/gradient " << i;
  }
  // Without grad mode nothing is recomputed.
  calls = 0;
  {
    torch::NoGradGuard no_grad;
    model::recompute(x0, block);
  }
  EXPECT_EQ(calls, 1);
  // A constant input still reaches the block's parameters.
  w1.mutable_grad() = torch::Tensor();
  model::recompute(x0, block).sum().backward();
  ASSERT_TRUE(w1.grad().defined());
  EXPECT_GT(w1.grad().abs().sum().item<double>(), 0);
}

TEST(Recompute, AHybridModelHasThePlainLossAndGradients) {
  single_threaded();
  auto j = base_recipe();
  j["pattern"] = "AEMEAFMR";
  j["depth"] = 8;
  j["mlp"] = {{"hidden", 24}};
  auto recipe = parse(j);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  model::HybridLM m(recipe, f64);
  randomize(m, 5);
  m.train();
  auto tokens = random_tokens(2, 17, recipe.vocab_size, 9);
  auto x = tokens.narrow(1, 0, 16), y = tokens.narrow(1, 1, 16);
  // Two documents in the first row, one in the second.
  auto doc_ids = torch::zeros({2, 17}, torch::kLong);
  doc_ids[0].narrow(0, 7, 10).fill_(1);
  auto run = [&](bool on) {
    m.set_recompute(on);
    for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
    auto out = m.loss(x, y, doc_ids);
    // A, M, A, F, M, R of the pattern: the MoE layers run as usual.
    EXPECT_EQ(count_nodes(out.total, "Recompute"), on ? 6 : 0);
    out.total.backward();
    std::map<std::string, torch::Tensor> g;
    for (const auto& p : m.named_parameters())
      if (p.value().grad().defined()) g[p.key()] = p.value().grad().clone();
    return std::make_pair(out.total.item<double>(), g);
  };
  const auto [plain_loss, plain] = run(false);
  const auto [ckpt_loss, ckpt] = run(true);
  EXPECT_DOUBLE_EQ(ckpt_loss, plain_loss);
  ASSERT_EQ(ckpt.size(), plain.size());
  EXPECT_GT(plain.size(), 20u);
  for (const auto& [name, g] : plain) {
    ASSERT_TRUE(ckpt.count(name)) << name;
    EXPECT_LT(max_abs_diff(ckpt.at(name), g), 1e-12 * (1 + g.abs().max().item<double>())) << name;
  }
}

}  // namespace
