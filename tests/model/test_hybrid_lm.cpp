// The assembled model: parameter names and shapes against the recipe accounting, the layer class of every
// layer of every shipped recipe, refusal of unimplemented letters and features, causality, the loss, and
// a float64 finite-difference gradient check.
#include <filesystem>
#include <map>
#include <set>

#include "model_test_util.h"
#include "recipe/shipped_recipes.h"
#include "slm/model/layer_registry.h"
#include <typeinfo>

#include "slm/recipe/accounting.h"

using namespace slm;
using namespace slm::test;

namespace {

const auto kMeta = torch::TensorOptions().device(torch::kMeta);

// A mid-size recipe: E slots thinned to F by layer_freq, several shared experts, windows, MTP depth 2.
nlohmann::json medium_json() {
  return nlohmann::json::parse(R"({
    "name": "medium", "vocab_size": 32000, "d_model": 1024, "depth": 16, "pattern": "AEEE", "seq_len": 2048,
    "attention": {"heads": 16, "kv_heads": 4, "head_dim": 64, "window_pattern": "SSL", "short_window": 512},
    "moe": {"routed_experts": 64, "experts_per_token": 6, "shared_experts": 2, "expert_hidden": 256,
            "shared_expert_hidden": 512, "layer_freq": 2},
    "mlp": {"hidden": 2816},
    "mtp": {"depth": 2, "pattern": "AE"}
  })");
}

void expect_params_match_accounting(const Recipe& r, const torch::TensorOptions& options) {
  model::HybridLM m(r, options);
  Accounting acc = account(r, m.plan());
  std::map<std::string, std::vector<int64_t>> built, expected;
  for (const auto& p : m.named_parameters()) built[p.key()] = p.value().sizes().vec();
  for (const auto& s : acc.params) expected[s.name] = std::vector<int64_t>(s.shape.begin(), s.shape.end());
  EXPECT_EQ(built.size(), m.named_parameters().size()) << "duplicate parameter names";
  EXPECT_EQ(expected.size(), acc.params.size());
  for (const auto& [name, shape] : expected) {
    auto it = built.find(name);
    if (it == built.end()) {
      ADD_FAILURE() << r.name << ": accounting lists " << name << " but the model has no such parameter";
      continue;
    }
    EXPECT_EQ(it->second, shape) << r.name << ": " << name;
  }
  for (const auto& [name, shape] : built)
    EXPECT_TRUE(expected.count(name)) << r.name << ": the model holds " << name << " which accounting does not list";

  model::ModelSummary s = model::summarize(m);
  EXPECT_EQ(s.total, acc.total);
  EXPECT_EQ(s.active, acc.active);
  EXPECT_EQ(s.mtp_total, acc.mtp_total);
  ASSERT_EQ(s.layers.size(), acc.layers.size());
  for (size_t i = 0; i < s.layers.size(); ++i) {
    EXPECT_EQ(s.layers[i].params, acc.layers[i].total) << "layer " << i;
    EXPECT_EQ(s.layers[i].active, acc.layers[i].active) << "layer " << i;
  }

  // The balancing bias is checkpointed state, never a gradient parameter.
  std::set<std::string> buffers;
  for (const auto& b : m.named_buffers()) buffers.insert(b.key());
  std::set<std::string> expected_buffers;
  for (const auto& l : m.plan().layers) {
    const std::string pre = "layers." + std::to_string(l.index) + ".";
    if (l.letter == 'E') expected_buffers.insert(pre + "moe.expert_bias");
    if (l.engram) expected_buffers.insert({pre + "engram.multipliers", pre + "engram.primes"});
  }
  if (r.engram.enabled) expected_buffers.insert("engram_canonical_ids");
  for (int k = 0; k < m.plan().mtp_depth; ++k)
    for (const auto& l : m.plan().mtp_layers)
      if (l.letter == 'E')
        expected_buffers.insert("mtp." + std::to_string(k) + ".layers." + std::to_string(l.index) + ".moe.expert_bias");
  EXPECT_EQ(buffers, expected_buffers);
}

// The dynamic type of a layer is the class the ownership table names for its letter.
bool has_class(const model::Layer& l, char letter) {
  return std::string(typeid(l).name()).find(model::layer_kind(letter).class_name) != std::string::npos;
}

}  // namespace

TEST(HybridLM, TinyParametersMatchAccountingByNameAndShape) {
  single_threaded();
  expect_params_match_accounting(tiny_ae(), torch::TensorOptions());
}

TEST(HybridLM, MediumParametersMatchAccountingByNameAndShape) {
  single_threaded();
  Recipe r = parse(medium_json());
  ASSERT_NE(make_plan(r).expanded.find('F'), std::string::npos);  // layer_freq thinned some E slots
  expect_params_match_accounting(r, kMeta);
}

// Engram on two A layers and mHC with 4 streams learned on some layers: per-stream Engram keys and norms, mixes
// only where placed, mhc_head, no resid/x0 lambdas, tables outside the totals.
TEST(HybridLM, EngramAndMhcParametersMatchAccountingByNameAndShape) {
  single_threaded();
  auto j = base_recipe();
  j["engram"] = {{"enabled", true}, {"layers", {0, 8}}, {"orders", "2,3,4"}, {"table_rows", 11}, {"embed_dim", 4}};
  j["mhc"] = {{"enabled", true}, {"streams", 4}, {"layers", {0, 1, 2, 5, 11}}};
  j["mtp"] = {{"depth", 1}, {"pattern", "AE"}};
  Recipe r = parse(j);
  expect_params_match_accounting(r, torch::TensorOptions());
  model::HybridLM m(r, kMeta);
  EXPECT_EQ(model::summarize(m).engram_tables, account(r, m.plan()).engram_tables);
  j["mhc"].erase("layers");  // all layers learn their mix
  expect_params_match_accounting(parse(j), kMeta);
}

// A letter added to the table without a layer class fails here, not when a recipe first uses it.
TEST(HybridLM, EveryLetterOfTheTableHasOneLayerClass) {
  const std::map<char, std::string> classes = {
      {'A', "AttentionLayer"}, {'E', "MoELayer"}, {'F', "MLPLayer"}, {'M', "Mamba3Layer"}, {'R', "M2RNNLayer"}};
  ASSERT_EQ(pattern_letters().size(), classes.size());
  for (const auto& row : pattern_letters()) {
    ASSERT_TRUE(classes.contains(row.letter)) << row.letter;
    EXPECT_EQ(model::layer_kind(row.family).class_name, classes.at(row.letter)) << row.letter;
  }
  EXPECT_EQ(model::layer_kinds().size(), classes.size());
}

TEST(HybridLM, EveryShippedRecipeBuildsEachLayerAsItsLettersClass) {
  single_threaded();
  int built = 0;
  for (const auto& path : test::shipped_recipes()) {
    SCOPED_TRACE(path);
    Recipe r = load_recipe(path);
    ModelPlan plan = make_plan(r);
    auto m = std::make_unique<model::HybridLM>(r, kMeta);
    ++built;
    ASSERT_EQ(m->layers().size(), plan.expanded.size());
    for (size_t i = 0; i < plan.expanded.size(); ++i) {
      const auto& layer = *m->layers()[i];
      const char letter = plan.expanded[i];
      EXPECT_EQ(layer.letter(), letter) << "layer " << i;
      EXPECT_STREQ(layer.class_name(), model::layer_kind(letter).class_name) << "layer " << i;
      EXPECT_TRUE(has_class(layer, letter)) << "layer " << i << " is not a " << model::layer_kind(letter).class_name;
    }
    expect_params_match_accounting(r, kMeta);  // Engram, mHC, MLA and DSA placement included
    ASSERT_EQ(m->mtp_modules().size(), static_cast<size_t>(plan.mtp_depth));
    for (const auto& mod : m->mtp_modules())
      for (size_t i = 0; i < plan.mtp_layers.size(); ++i)
        EXPECT_TRUE(has_class(*mod->layers[i], plan.mtp_layers[i].letter)) << "MTP layer " << i;
  }
  EXPECT_EQ(built, static_cast<int>(test::shipped_recipes().size()));
  EXPECT_GE(built, 10);
}

TEST(HybridLM, EveryOptionalFeatureBuilds) {
  single_threaded();
  auto j = base_recipe();  // has sections for every letter
  j["pattern"] = "AE";
  // Engram and mHC build (tests/model/test_engram.cpp and test_mhc.cpp check what they compute).
  j["engram"] = {{"enabled", true}, {"layers", {0}}, {"table_rows", 7}, {"embed_dim", 4}};
  j["mhc"] = {{"enabled", true}, {"streams", 2}};
  EXPECT_NO_THROW(model::HybridLM(parse(j), kMeta));
  j.erase("engram");
  j.erase("mhc");
  // DSA and MLA build (tests/model/test_dsa.cpp and test_mla.cpp check what they compute).
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_indexer_heads"] = 2;
  j["attention"]["dsa_indexer_dim"] = 4;
  j["attention"]["mla_layers"] = "all";
  EXPECT_NO_THROW(model::HybridLM(parse(j), kMeta));
  j["attention"].erase("dsa_enabled");
  j["attention"].erase("dsa_indexer_heads");
  j["attention"].erase("dsa_indexer_dim");
  j["attention"].erase("mla_layers");
  model::HybridLM ok(parse(j), kMeta);  // A + E alone builds
  EXPECT_EQ(ok.layers().size(), 12u);
}

TEST(HybridLM, ResidualLambdasFollowTheNanochatSchedule) {
  single_threaded();
  model::HybridLM m(tiny_ae());
  const int64_t n = 6;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(m.resid_lambdas[i].item<double>(), 1.15 - 0.10 * i / (n - 1), 1e-6);
    EXPECT_NEAR(m.x0_lambdas[i].item<double>(), 0.20 - 0.15 * i / (n - 1), 1e-6);
  }
  auto j = micro_ae_json();
  j["depth"] = 1;
  j["pattern"] = "A";
  model::HybridLM one(parse(j));
  EXPECT_EQ(one.resid_lambdas.item<double>(), 1.0);
  EXPECT_EQ(one.x0_lambdas.item<double>(), 0.0);
}

TEST(HybridLM, ChangingLaterTokensNeverChangesEarlierLogits) {
  single_threaded();
  model::HybridLM m(tiny_ae());
  randomize(m, 11);
  m.eval();
  torch::NoGradGuard no_grad;
  auto a = random_tokens(2, 48, 384, 1);
  const int64_t t = 23;
  auto b = a.clone();
  b.narrow(1, t + 1, 48 - t - 1).copy_(random_tokens(2, 48 - t - 1, 384, 2));
  auto la = m.forward(a).logits, lb = m.forward(b).logits;
  EXPECT_LT(max_abs_diff(la.narrow(1, 0, t + 1), lb.narrow(1, 0, t + 1)), 1e-5);
  EXPECT_GT(max_abs_diff(la.narrow(1, t + 1, 1), lb.narrow(1, t + 1, 1)), 1e-3);
  // The MTP heads are causal too.
  auto ma = m.mtp_logits(a, m.forward(a).hidden), mb = m.mtp_logits(b, m.forward(b).hidden);
  ASSERT_EQ(ma.size(), 1u);
  EXPECT_LT(max_abs_diff(ma[0].narrow(1, 0, t), mb[0].narrow(1, 0, t)), 1e-5);
}

TEST(HybridLM, LossIsMainPlusWeightedMtpPlusAux) {
  single_threaded();
  auto j = micro_ae_json();
  Recipe r = parse(j);
  model::HybridLM m(r);
  randomize(m, 12);
  m.train();
  auto tokens = random_tokens(2, 10, 13, 3);
  auto targets = random_tokens(2, 10, 13, 4);
  targets[0][3] = model::kIgnoreIndex;
  auto out = m.loss(tokens, targets);
  ASSERT_EQ(out.mtp.size(), 2u);
  EXPECT_GT(out.aux.item<double>(), 0.0);
  EXPECT_NEAR(out.total.item<double>(),
              out.main.item<double>() + 0.3 / 2 * (out.mtp[0].item<double>() + out.mtp[1].item<double>()) +
                  out.aux.item<double>(),
              1e-5);
  // Main loss by hand, skipping the ignored target.
  auto logits = m.forward(tokens).logits;
  auto logp = torch::log_softmax(logits, -1);
  double sum = 0;
  int count = 0;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 10; ++t) {
      int64_t y = targets[b][t].item<int64_t>();
      if (y == model::kIgnoreIndex) continue;
      sum -= logp[b][t][y].item<double>();
      ++count;
    }
  EXPECT_NEAR(out.main.item<double>(), sum / count, 1e-5);
  // MTP module 2 predicts targets[:, 2:] from positions 0..T-3.
  auto l2 = m.mtp_logits(tokens, m.forward(tokens).hidden)[1];
  EXPECT_EQ(l2.size(1), 8);
  // Every trainable tensor receives a gradient.
  out.total.backward();
  for (const auto& p : m.named_parameters())
    EXPECT_TRUE(p.value().grad().defined() && p.value().grad().abs().sum().item<double>() > 0) << p.key();
}

TEST(HybridLM, BalancingBiasesMoveAfterTrainingForwards) {
  single_threaded();
  model::HybridLM m(tiny_ae());
  randomize(m, 13);
  m.train();
  m.loss(random_tokens(2, 32, 384, 5), random_tokens(2, 32, 384, 6));
  auto moes = m.moe_modules();
  ASSERT_EQ(moes.size(), 3u);  // three E layers; the MTP module is A + F
  for (auto* e : moes) EXPECT_EQ(e->pending_load().sum().item<int64_t>(), 2 * 32 * 2);
  m.update_balancing_biases();
  for (auto* e : moes) EXPECT_GT(e->expert_bias.abs().sum().item<double>(), 0.0);
}

// Central differences in float64 against autograd for entries of every parameter of a micro A+E model with two
// MTP modules, a short window and the sequence-wise aux loss on.
TEST(HybridLM, GradientCheckFloat64) {
  single_threaded();
  Recipe r = parse(micro_ae_json());
  model::HybridLM m(r, torch::TensorOptions().dtype(torch::kDouble));
  randomize(m, 14);
  m.train();
  auto tokens = random_tokens(2, 7, 13, 7);
  auto targets = random_tokens(2, 7, 13, 8);
  auto loss = [&] { return m.loss(tokens, targets).total; };
  auto l = loss();
  l.backward();
  torch::NoGradGuard no_grad;
  const double eps = 1e-6;
  int checked = 0;
  for (auto& p : m.named_parameters()) {
    auto flat = p.value().view({-1});
    auto grad = p.value().grad().view({-1});
    // Up to 16 entries spread over each tensor keep the check to a few seconds.
    const int64_t stride = std::max<int64_t>(1, flat.numel() / 16);
    for (int64_t i = 0; i < flat.numel(); i += stride) {
      const double orig = flat[i].item<double>();
      flat[i] = orig + eps;
      const double up = loss().item<double>();
      flat[i] = orig - eps;
      const double down = loss().item<double>();
      flat[i] = orig;
      const double numeric = (up - down) / (2 * eps);
      const double analytic = grad[i].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric)) << p.key() << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 400);
}
