// The tiny hybrid recipe (AEMEAEMEAEMR) builds with its M and R layers, matches the accounting, and its
// prefill / decode / rollback reproduce the full forward; a MIMO variant likewise.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ops/mamba3_fixture.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/layer_registry.h"
#include "slm/model/layers/m2rnn.h"
#include "slm/model/layers/mamba3.h"
#include "slm/recipe/accounting.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

namespace {

Recipe tiny_hybrid(bool mimo) {
  auto j = nlohmann::json::parse(std::ifstream(source_path("recipes/tiny-hybrid.json")));
  if (mimo) {
    j["mamba3"]["is_mimo"] = true;
    j["mamba3"]["mimo_rank"] = 2;
    j["mamba3"]["chunk_size"] = 8;
  }
  return parse(j);
}

// Fresh models have zero output projections; give every parameter unit-ish noise (1-D ones around 1).
void randomize(model::HybridLM& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    if (p.dim() >= 2) p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(-1))));
    else p.normal_(1.0, 0.1);
  }
}

void expect_decode_matches_forward(bool mimo) {
  // ctest runs two processes on two cores: intra-op threads on these tiny tensors only contend.
  torch::set_num_threads(1);
  torch::manual_seed(5);
  model::HybridLM m(tiny_hybrid(mimo), torch::TensorOptions().dtype(torch::kDouble));
  randomize(m);
  m.eval();
  torch::NoGradGuard no_grad;
  const int64_t prompt = 21, total = 40;
  auto tokens = torch::randint(512, {2, total}, torch::kLong);
  auto full = m.forward(tokens).logits;
  const double tol = 1e-6;  // float64 model; the head may round logits to float32

  auto state = m.new_state(2, total, /*max_rollback=*/4);
  EXPECT_LE(max_rel_diff(m.prefill(tokens.narrow(1, 0, prompt), state), full.narrow(1, 0, prompt)), tol);
  for (int64_t t = prompt; t < total; ++t)
    EXPECT_LE(max_rel_diff(m.decode(tokens.select(1, t), state), full.select(1, t)), tol) << "token " << t;

  // Drop 4 tokens and re-run them as one verification prefill, as a speculative decoder does.
  state.rollback(4);
  EXPECT_LE(max_rel_diff(m.prefill(tokens.narrow(1, total - 4, 4), state), full.narrow(1, total - 4, 4)), tol);
}

}  // namespace

TEST(Mamba3Hybrid, TinyHybridBuildsEveryLetter) {
  Recipe r = tiny_hybrid(false);
  model::HybridLM m(r);
  ASSERT_EQ(m.layers().size(), 12u);
  for (size_t i = 0; i < m.layers().size(); ++i) {
    const auto& l = *m.layers()[i];
    const char letter = r.pattern[i];
    EXPECT_EQ(l.letter(), letter);
    EXPECT_STREQ(l.class_name(), model::layer_kind(letter).class_name);
    if (letter == 'M') {
      EXPECT_NE(dynamic_cast<const model::Mamba3Layer*>(&l), nullptr) << i;
    }
    if (letter == 'R') {
      EXPECT_NE(dynamic_cast<const model::M2RNNLayer*>(&l), nullptr) << i;
    }
  }
  std::map<std::string, std::vector<int64_t>> built, expected;
  for (const auto& p : m.named_parameters()) built[p.key()] = p.value().sizes().vec();
  for (const auto& s : account(r, m.plan()).params)
    expected[s.name] = std::vector<int64_t>(s.shape.begin(), s.shape.end());
  EXPECT_EQ(built, expected);
}

TEST(Mamba3Hybrid, DecodeAndPrefillMatchForwardSiso) { expect_decode_matches_forward(false); }
TEST(Mamba3Hybrid, DecodeAndPrefillMatchForwardMimo) { expect_decode_matches_forward(true); }
