#pragma once
// Checks shared by the recurrent layer tests (M, R): accounting names, decode == forward, chunked prefill
// with rollback, causality and a float64 gradient check.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/mamba3_fixture.h"
#include "slm/model/layer.h"
#include "slm/recipe/accounting.h"
#include "slm/recipe/plan.h"

namespace slm::test {

// The layer's parameters, named as the accounting names them under "layers.{index}.".
inline void expect_accounting_names(const Recipe& r, const model::Layer& layer, int index) {
  ModelPlan plan = make_plan(r);
  auto specs = layer_param_specs(r, plan.layers.at(index), "layers." + std::to_string(index) + ".", 1, {});
  std::map<std::string, std::vector<int64_t>> want, got;
  for (const auto& s : specs) want[s.name] = std::vector<int64_t>(s.shape.begin(), s.shape.end());
  for (const auto& p : layer.named_parameters())
    got["layers." + std::to_string(index) + "." + p.key()] = p.value().sizes().vec();
  EXPECT_EQ(got, want);
}

// Fresh layers zero their output projection; perturb every parameter so the checks see a real function.
inline void randomize(model::Layer& layer, double scale = 0.1) {
  torch::NoGradGuard no_grad;
  for (auto& p : layer.parameters()) p.add_(torch::randn_like(p) * scale);
  for (auto& p : layer.named_parameters())
    if (p.key().find("out_proj") != std::string::npos) p.value().normal_(0, 0.3);
}

// Token-by-token decode, and prefill in uneven pieces, reproduce forward; rollback restores the state.
inline void expect_decode_matches_forward(model::Layer& layer, int64_t d_model, int64_t tokens, double tol) {
  // ctest runs two processes on two cores: intra-op threads on these tiny tensors only contend.
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, tokens, d_model}, torch::kDouble);
  auto ref = layer.forward(x);

  auto cache = layer.make_cache(2, tokens, 0);
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < tokens; ++t) outs.push_back(layer.decode(x.narrow(1, t, 1), cache.get()));
  EXPECT_LE(max_rel_diff(torch::cat(outs, 1), ref), tol) << "decode";

  // Pieces of 1, 17 and the rest, with rollback depth 3: the last 3 tokens of each piece are stepped.
  auto pc = layer.make_cache(2, tokens, 3);
  auto a = layer.prefill(x.narrow(1, 0, 1), pc.get());
  auto b = layer.prefill(x.narrow(1, 1, 17), pc.get());
  auto c = layer.prefill(x.narrow(1, 18, tokens - 18), pc.get());
  EXPECT_EQ(pc->length(), tokens);
  EXPECT_LE(max_rel_diff(torch::cat({a, b, c}, 1), ref), tol) << "prefill";

  // Roll back 3 tokens, then feed 2 different tokens and the last 3 again.
  pc->rollback(3);
  EXPECT_EQ(pc->length(), tokens - 3);
  layer.prefill(torch::randn({2, 2, d_model}, torch::kDouble), pc.get());
  pc->rollback(2);
  auto again = layer.prefill(x.narrow(1, tokens - 3, 3), pc.get());
  EXPECT_LE(max_rel_diff(again, ref.narrow(1, tokens - 3, 3)), tol) << "after rollback";
  EXPECT_ANY_THROW(pc->rollback(4));
}

// Changing token t0 changes no output before t0 (and does change the output at t0).
inline void expect_causal(model::Layer& layer, int64_t d_model, int64_t tokens, int64_t t0) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({1, tokens, d_model}, torch::kDouble);
  auto x2 = x.clone();
  x2.narrow(1, t0, 1).add_(1.0);
  auto y = layer.forward(x), y2 = layer.forward(x2);
  EXPECT_TRUE(torch::equal(y.narrow(1, 0, t0), y2.narrow(1, 0, t0)));
  EXPECT_GT((y.narrow(1, t0, 1) - y2.narrow(1, t0, 1)).abs().max().item<double>(), 1e-6);
}

// Every parameter and the input, through the sequence path.
inline void expect_layer_gradcheck(model::Layer& layer, int64_t d_model, int64_t tokens) {
  auto x = torch::randn({2, tokens, d_model}, torch::kDouble).requires_grad_(true);
  auto w = torch::randn({2, tokens, d_model}, torch::kDouble);
  std::vector<torch::Tensor> leaves = layer.parameters();
  leaves.push_back(x);
  expect_gradcheck([&] { return (layer.forward(x) * w).sum(); }, leaves);
}

}  // namespace slm::test
