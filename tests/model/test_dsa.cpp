// DSA: the selection rule against a naive loop, the indexer scores against a float64 loop, the KL term (zero when
// the indexer reproduces the attention distribution), k >= t equals dense attention, gradients reach only their
// targets in both stages, decode == prefill, causality; and a whole model with MLA, DSA and an MLA MTP module.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "model/model_test_util.h"
#include "model/recurrent_layer_checks.h"
#include "slm/model/layers/attention.h"
#include "slm/ops/dsa_select.h"
#include "slm/ops/fused_kernels.h"
#include "slm/ops/sparse_attention.h"
#include "slm/recipe/accounting.h"

using namespace slm;
using namespace slm::test;
using model::DsaStage;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// Two A layers: layer 0 has a 9-token window, layer 1 full context; both DSA.
nlohmann::json dsa_json(bool mla, double ratio, int local) {
  auto j = nlohmann::json::parse(R"({
    "name": "dsa", "vocab_size": 16, "d_model": 16, "depth": 2, "pattern": "A", "seq_len": 64,
    "attention": {"heads": 4, "kv_heads": 2, "head_dim": 4, "rope_theta": 500, "window_pattern": "SL",
                  "short_window": 9, "dsa_enabled": true, "dsa_indexer_heads": 3, "dsa_indexer_dim": 8,
                  "mla": {"q_lora_rank": 6, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4,
                          "v_head_dim": 4}}
  })");
  j["attention"]["dsa_top_k_ratio"] = ratio;
  j["attention"]["dsa_local_window"] = local;
  if (mla) j["attention"]["mla_layers"] = "all";
  return j;
}

std::shared_ptr<model::AttentionLayer> dsa_layer(const Recipe& r, int index, uint64_t seed) {
  auto plan = make_plan(r);
  auto layer = std::make_shared<model::AttentionLayer>(r, plan.layers.at(index), kF64);
  torch::manual_seed(seed);
  randomize(*layer, 0.3);
  torch::NoGradGuard no_grad;
  for (auto& p : layer->named_parameters())
    if (p.key() == "attn.wo.weight") p.value().normal_(0.0, 0.3);
  return layer;
}

bool is_indexer(const std::string& name) {
  return name.find("indexer.") != std::string::npos;
}

torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w) {
  return x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-5) * w;
}

}  // namespace

TEST(DsaSelect, KeysPerQueryFollowTheRule) {
  // k = min(n, max(floor(ratio * n), local)) for a query that sees n keys.
  EXPECT_EQ(model::dsa_keys_per_query(1, 0.5, 3), 1);
  EXPECT_EQ(model::dsa_keys_per_query(2, 0.5, 3), 2);
  EXPECT_EQ(model::dsa_keys_per_query(5, 0.5, 3), 3);
  EXPECT_EQ(model::dsa_keys_per_query(8, 0.5, 3), 4);
  EXPECT_EQ(model::dsa_keys_per_query(11, 0.5, 3), 5);
  EXPECT_EQ(model::dsa_keys_per_query(100, 0.29, 1), 29);
  EXPECT_EQ(model::dsa_keys_per_query(4096, 0.5, 128), 2048);
  EXPECT_EQ(model::dsa_keys_per_query(200, 0.5, 128), 128);
  EXPECT_EQ(model::dsa_keys_per_query(7, 1.0, 2), 7);
}

TEST(DsaSelect, MatchesNaiveSelection) {
  torch::set_num_threads(1);
  torch::manual_seed(7);
  const double ratio = 0.4;
  const int64_t local = 2, b = 2, t = 6, s = 14;
  for (int64_t window : {0, 8}) {
    // Small integer scores: many ties, which go to the earlier position.
    auto scores = torch::randint(0, 4, {b, t, s}, kF64);
    auto index = model::dsa_select(scores, ratio, local, window);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < t; ++j) {
        const int64_t p = s - t + j;
        std::vector<int64_t> visible;
        for (int64_t key = 0; key <= p; ++key)
          if (window == 0 || p - key < window) visible.push_back(key);
        const auto n = static_cast<int64_t>(visible.size());
        const int64_t k = std::min(n, std::max(static_cast<int64_t>(ratio * n), local));
        std::set<int64_t> expected;
        std::vector<int64_t> rest;
        for (int64_t key : visible)
          if (p - key < local)
            expected.insert(key);
          else
            rest.push_back(key);
        std::stable_sort(rest.begin(), rest.end(), [&](int64_t x, int64_t y) {
          return scores[i][j][x].item<double>() > scores[i][j][y].item<double>();
        });
        for (int64_t m = 0; static_cast<int64_t>(expected.size()) < k; ++m) expected.insert(rest[m]);
        std::set<int64_t> got;
        for (int64_t slot = 0; slot < index.size(2); ++slot)
          if (index[i][j][slot].item<int64_t>() >= 0) got.insert(index[i][j][slot].item<int64_t>());
        EXPECT_EQ(got, expected) << "window " << window << " query " << p;
      }
  }
}

// The decode form: one query per row, each at its own position, scored over a whole capacity whose entries past the
// position hold junk (larger than any real score); the keys and their order are dsa_select's for that query.
TEST(DsaSelect, AtAPositionPicksWhatDsaSelectPicks) {
  torch::manual_seed(8);
  const int64_t b = 3, s = 20, capacity = 29;
  for (double ratio : {0.4, 0.5})
    for (int64_t local : {1, 3})
      for (int64_t window : {0, 8}) {
        const auto scores = torch::randint(0, 4, {b, s, s}, kF64);  // small integers: ties
        const auto want = model::dsa_select(scores, ratio, local, window);
        for (int64_t p = 0; p < s; ++p) {
          auto at = torch::full({b, 1, capacity}, 10.0, kF64);
          std::vector<int64_t> position(static_cast<size_t>(b));
          for (int64_t i = 0; i < b; ++i) {
            const int64_t q = position[static_cast<size_t>(i)] = (p + 7 * i) % s;
            at[i][0].narrow(0, 0, q + 1).copy_(scores[i][q].narrow(0, 0, q + 1));
          }
          const auto got = model::dsa_select_at(at, torch::tensor(position), ratio, local, window);
          ASSERT_EQ(got.size(2), model::dsa_keys_per_query(window ? window : capacity, ratio, local));
          for (int64_t i = 0; i < b; ++i) {
            const auto w = want[i][position[static_cast<size_t>(i)]];
            for (int64_t slot = 0; slot < std::max(got.size(2), w.size(0)); ++slot) {
              const int64_t expected = slot < w.size(0) ? w[slot].item<int64_t>() : -1;
              const int64_t actual = slot < got.size(2) ? got[i][0][slot].item<int64_t>() : -1;
              ASSERT_EQ(actual, expected) << "ratio " << ratio << " local " << local << " window " << window
                                          << " position " << position[static_cast<size_t>(i)] << " slot " << slot;
            }
          }
        }
      }
}

TEST(DsaKl, ZeroWhenTheIndexerReproducesTheTargetAndNaiveOtherwise) {
  torch::set_num_threads(1);
  torch::manual_seed(8);
  // Rows over 7 keys, some undefined (target 0, logit -inf).
  auto defined = torch::rand({3, 5, 7}) > 0.3;
  defined.select(2, 0).fill_(true);
  auto raw = torch::rand({3, 5, 7}, kF64).masked_fill(defined.logical_not(), 0.0);
  auto target = raw / raw.sum(-1, true);
  const double inf = std::numeric_limits<double>::infinity();
  // log target plus any per-row constant is the same distribution.
  auto matching = (target.log() + torch::randn({3, 5, 1}, kF64)).masked_fill(defined.logical_not(), -inf);
  EXPECT_LT(std::abs(model::dsa_kl(target, matching).item<double>()), 1e-12);
  auto logits = torch::randn({3, 5, 7}, kF64).masked_fill(defined.logical_not(), -inf);
  double sum = 0;
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      double z = 0;
      for (int64_t k = 0; k < 7; ++k)
        if (defined[i][j][k].item<bool>()) z += std::exp(logits[i][j][k].item<double>());
      for (int64_t k = 0; k < 7; ++k)
        if (defined[i][j][k].item<bool>()) {
          const double p = target[i][j][k].item<double>(), q = std::exp(logits[i][j][k].item<double>()) / z;
          sum += p * std::log(p / q);
        }
    }
  EXPECT_NEAR(model::dsa_kl(target, logits).item<double>(), sum / 15, 1e-12);
  EXPECT_GT(sum, 1e-3);
}

TEST(DsaIndexer, ScoresMatchFloat64Loop) {
  torch::set_num_threads(1);
  auto layer = dsa_layer(parse(dsa_json(false, 0.5, 2)), 1, 9);
  auto& ix = *layer->indexer();
  ASSERT_EQ(ix.rope_dims, 4);
  const int64_t t = 7, heads = 3, dim = 8;
  auto h = torch::randn({1, t, 16}, kF64);
  const model::RotaryPositions pos{0, {}, t};
  auto got = ix.scores(h, ix.keys(h, pos), pos);
  auto rope = [](torch::Tensor x, int64_t p) {  // half-split on the first 4 dims, theta 500
    auto out = x.clone();
    for (int64_t i = 0; i < 2; ++i) {
      const double a = p * std::pow(500.0, -i / 2.0);
      const double x1 = x[i].item<double>(), x2 = x[i + 2].item<double>();
      out[i] = x1 * std::cos(a) - x2 * std::sin(a);
      out[i + 2] = x2 * std::cos(a) + x1 * std::sin(a);
    }
    return out;
  };
  auto kraw = torch::matmul(h[0], ix.wk->weight.dense().t());  // [t, dim]
  auto mean = kraw.mean(-1, true), var = (kraw - mean).pow(2).mean(-1, true);
  auto kn = (kraw - mean) / torch::sqrt(var + 1e-5) * ix.k_norm->weight + ix.k_norm->bias;
  auto q = torch::matmul(h[0], ix.wq->weight.dense().t()).view({t, heads, dim});
  auto w = torch::matmul(h[0], ix.weights_proj->weight.dense().t()) / std::sqrt(double(heads * dim));
  for (int64_t p = 0; p < t; ++p)
    for (int64_t s = 0; s < t; ++s) {
      double expected = 0;
      auto ks = rope(kn[s], s);
      for (int64_t j = 0; j < heads; ++j)
        expected += w[p][j].item<double>() * std::max(0.0, (rope(q[p][j], p) * ks).sum().item<double>());
      EXPECT_NEAR(got[0][p][s].item<double>(), expected, 1e-12) << p << "," << s;
    }
}

TEST(DsaLayer, KAtLeastTEqualsDenseAttention) {
  torch::set_num_threads(1);
  for (bool mla : {false, true})
    for (int index : {0, 1}) {
      // ratio 1: every visible key is selected.
      Recipe r = parse(dsa_json(mla, 1.0, 1));
      auto layer = dsa_layer(r, index, 10);
      // The same weights without DSA.
      auto j = dsa_json(mla, 1.0, 1);
      j["attention"].erase("dsa_enabled");
      auto plain = std::make_shared<model::AttentionLayer>(parse(j), make_plan(parse(j)).layers.at(index), kF64);
      {
        torch::NoGradGuard no_grad;
        auto src = layer->named_parameters();
        for (auto& p : plain->named_parameters()) p.value().copy_(src[p.key()]);
      }
      auto x = torch::randn({2, 13, 16}, kF64);
      layer->indexer()->stage = DsaStage::Sparse;
      auto sparse = layer->forward(x);
      EXPECT_LT(max_rel_diff(sparse, plain->forward(x)), 1e-12) << "mla " << mla << " layer " << index;
      layer->indexer()->stage = DsaStage::Warmup;
      EXPECT_LT(max_rel_diff(layer->forward(x), plain->forward(x)), 1e-12);
    }
}

TEST(DsaLayer, SparseOutputIsAttentionOverTheSelectedKeys) {
  torch::set_num_threads(1);
  Recipe r = parse(dsa_json(false, 0.3, 2));
  auto layer = dsa_layer(r, 1, 11);
  auto& a = *layer->attn;
  const int64_t b = 2, t = 12;
  auto x = torch::randn({b, t, 16}, kF64);
  // GQA q, k, v as the attention layer test builds them, then the plain sparse reference over dsa_select's keys.
  auto h = rms(x, layer->norm->weight);
  const model::Rope rope(4, 500);
  const model::RotaryPositions pos{0, {}, t};
  auto q = rms(rope(torch::matmul(h, a.wq->weight.dense().t()).view({b, t, 4, 4}), pos), a.q_norm->weight);
  auto k = rms(rope(torch::matmul(h, a.wk->weight.dense().t()).view({b, t, 2, 4}), pos), a.k_norm->weight);
  auto v = torch::matmul(h, a.wv->weight.dense().t()).view({b, t, 2, 4});
  auto& ix = *layer->indexer();
  auto index = model::dsa_select(ix.scores(h, ix.keys(h, pos), pos), 0.3, 2, 0);
  ASSERT_LT(index.ge(0).sum().item<int64_t>(), b * t * (t + 1) / 2);  // something was left out
  auto o = ops::sparse_attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), index, 0.5).out;
  auto expected = torch::matmul(o.transpose(1, 2).reshape({b, t, 16}), a.wo->weight.dense().t());
  EXPECT_LT(max_rel_diff(layer->forward(x), expected), 1e-12);
}

TEST(DsaLayer, KlIsZeroWhenTheIndexerReproducesTheAttention) {
  torch::set_num_threads(1);
  for (bool mla : {false, true})
    for (auto stage : {DsaStage::Warmup, DsaStage::Sparse}) {
      auto layer = dsa_layer(parse(dsa_json(mla, 0.5, 2)), 1, 12);
      layer->indexer()->stage = stage;
      // Zero queries make the attention uniform over the keys it reads; zero head weights make every indexer
      // score 0, the uniform distribution over the same keys.
      {
        torch::NoGradGuard no_grad;
        for (auto& p : layer->named_parameters())
          if (p.key() == "attn.wq.weight" || p.key() == "attn.wq_b.weight" ||
              p.key() == "attn.indexer.weights_proj.weight")
            p.value().zero_();
      }
      auto x = torch::randn({2, 10, 16}, kF64);
      layer->forward(x);
      ASSERT_TRUE(layer->indexer()->loss().defined());
      EXPECT_LT(std::abs(layer->indexer()->loss().item<double>()), 1e-12) << "mla " << mla;
      {
        torch::NoGradGuard no_grad;
        layer->indexer()->weights_proj->weight.dense().normal_(0.0, 3.0);
      }
      layer->forward(x);
      EXPECT_GT(layer->indexer()->loss().item<double>(), 1e-4);
      layer->eval();
      layer->forward(x);
      EXPECT_FALSE(layer->indexer()->loss().defined());  // no KL outside training
    }
}

TEST(DsaLayer, GradientsReachOnlyTheirTargetsInBothStages) {
  torch::set_num_threads(1);
  for (bool mla : {false, true})
    for (auto stage : {DsaStage::Warmup, DsaStage::Sparse}) {
      auto layer = dsa_layer(parse(dsa_json(mla, 0.5, 2)), 1, 13);
      layer->indexer()->stage = stage;
      auto x = torch::randn({2, 10, 16}, kF64).requires_grad_(true);
      auto out = layer->forward(x);
      auto kl = layer->indexer()->loss();
      auto params = layer->named_parameters();
      std::vector<torch::Tensor> leaves = params.values();
      leaves.push_back(x);
      // The output's gradient: everything but the indexer.
      auto g = torch::autograd::grad({(out * torch::randn_like(out)).sum()}, leaves, {}, true, false, true);
      for (size_t i = 0; i < params.size(); ++i) {
        const bool reached = g[i].defined() && g[i].abs().sum().item<double>() > 0;
        EXPECT_EQ(reached, !is_indexer(params.keys()[i])) << "output -> " << params.keys()[i];
      }
      // The KL's gradient: the indexer only, never the input.
      g = torch::autograd::grad({kl}, leaves, {}, false, false, true);
      for (size_t i = 0; i < params.size(); ++i) {
        const bool reached = g[i].defined() && g[i].abs().sum().item<double>() > 0;
        EXPECT_EQ(reached, is_indexer(params.keys()[i])) << "kl -> " << params.keys()[i];
      }
      EXPECT_FALSE(g.back().defined() && g.back().abs().sum().item<double>() > 0);
    }
}

TEST(DsaLayer, DecodePrefillAndRollbackMatchForward) {
  for (bool mla : {false, true})
    for (int index : {0, 1}) {
      auto layer = dsa_layer(parse(dsa_json(mla, 0.5, 3)), index, 14);
      layer->eval();
      expect_decode_matches_forward(*layer, 16, 24, 1e-10);
    }
}

TEST(DsaLayer, Causal) {
  torch::set_num_threads(1);
  for (bool mla : {false, true}) {
    auto layer = dsa_layer(parse(dsa_json(mla, 0.5, 2)), 1, 15);
    expect_causal(*layer, 16, 14, 9);
  }
}

namespace {

// A layers 0, 2, 4: MLA; MLA + DSA; GQA + DSA (DSA from layer 2). MTP module of one MLA layer.
nlohmann::json model_json() {
  return nlohmann::json::parse(R"({
    "name": "mla-dsa", "vocab_size": 32, "d_model": 16, "depth": 6, "pattern": "AE", "seq_len": 64,
    "attention": {"heads": 4, "kv_heads": 2, "head_dim": 4, "window_pattern": "SL", "short_window": 7,
                  "mla_layers": [0, 2], "mla": {"q_lora_rank": 6, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
                                                "qk_rope_head_dim": 4, "v_head_dim": 4},
                  "dsa_enabled": true, "dsa_start_layer": 2, "dsa_top_k_ratio": 0.5, "dsa_local_window": 3,
                  "dsa_indexer_heads": 2, "dsa_indexer_dim": 8},
    "moe": {"routed_experts": 4, "experts_per_token": 2, "expert_hidden": 8},
    "mtp": {"depth": 1, "pattern": "AE", "mla": true}
  })");
}

}  // namespace

TEST(DsaModel, BuildsTheRecipePlacementAndMatchesTheAccounting) {
  torch::set_num_threads(1);
  Recipe r = parse(model_json());
  model::HybridLM m(r);
  auto attn = [&](int i) { return dynamic_cast<model::AttentionLayer*>(m.layers()[i].get()); };
  EXPECT_TRUE(attn(0)->mla && !attn(0)->indexer());
  EXPECT_TRUE(attn(2)->mla && attn(2)->indexer());
  EXPECT_TRUE(attn(4)->attn && attn(4)->indexer());
  auto* mtp_attn = dynamic_cast<model::AttentionLayer*>(m.mtp_modules()[0]->layers[0].get());
  ASSERT_TRUE(mtp_attn);
  EXPECT_TRUE(mtp_attn->mla && !mtp_attn->indexer());
  std::map<std::string, std::vector<int64_t>> built, expected;
  for (const auto& p : m.named_parameters()) built[p.key()] = p.value().sizes().vec();
  for (const auto& s : account(r, m.plan()).params)
    expected[s.name] = std::vector<int64_t>(s.shape.begin(), s.shape.end());
  EXPECT_EQ(built, expected);
  // indexer_parameters() is exactly the indexer tensors of layers 2 and 4.
  std::set<const void*> indexer;
  for (const auto& t : m.indexer_parameters()) indexer.insert(t.data_ptr());
  size_t named = 0;
  for (const auto& p : m.named_parameters())
    if (is_indexer(p.key())) {
      ++named;
      EXPECT_TRUE(indexer.count(p.value().data_ptr())) << p.key();
    }
  EXPECT_EQ(named, 10u);
  EXPECT_EQ(indexer.size(), named);
}

TEST(DsaModel, DecodeChunkedPrefillAndRollbackMatchForward) {
  torch::set_num_threads(1);
  model::HybridLM m(parse(model_json()));
  randomize(m, 16);
  m.eval();
  torch::NoGradGuard no_grad;
  const int64_t total = 30;
  auto tokens = random_tokens(2, total, 32, 17);
  auto full = m.forward(tokens).logits;
  auto state = m.new_state(2, total + 4, 4);
  auto pre = m.prefill(tokens.narrow(1, 0, 11), state);
  EXPECT_LT(max_abs_diff(pre, full.narrow(1, 0, 11)), 1e-4);
  m.prefill(tokens.narrow(1, 11, 5), state);
  double worst = 0;
  for (int64_t t = 16; t < total; ++t)
    worst = std::max(worst, max_abs_diff(m.decode(tokens.select(1, t), state), full.select(1, t)));
  EXPECT_LT(worst, 1e-4);
  // Speculative rollback: 4 wrong tokens, rolled back, then the right ones.
  auto wrong = random_tokens(2, 4, 32, 18);
  m.prefill(wrong, state);
  state.rollback(4);
  auto again = torch::cat({tokens, wrong.narrow(1, 0, 2)}, 1);
  auto ref = m.forward(again).logits;
  auto step = m.prefill(wrong.narrow(1, 0, 2), state);
  EXPECT_LT(max_abs_diff(step, ref.narrow(1, total, 2)), 1e-4);
  // MTP draft over the MLA module.
  EXPECT_EQ(m.draft(state, tokens.select(1, 0)).sizes(), (std::vector<int64_t>{2, 1}));
}

TEST(DsaModel, Causal) {
  torch::set_num_threads(1);
  model::HybridLM m(parse(model_json()));
  randomize(m, 19);
  m.eval();
  torch::NoGradGuard no_grad;
  auto a = random_tokens(1, 24, 32, 20);
  auto b = a.clone();
  b.narrow(1, 15, 9).copy_(random_tokens(1, 9, 32, 21));
  auto la = m.forward(a).logits, lb = m.forward(b).logits;
  EXPECT_LT(max_abs_diff(la.narrow(1, 0, 15), lb.narrow(1, 0, 15)), 1e-6);
  EXPECT_GT(max_abs_diff(la.narrow(1, 15, 1), lb.narrow(1, 15, 1)), 1e-4);
}

TEST(DsaModel, LossAddsTheIndexerKlAndTheStageSwitchesAttention) {
  torch::set_num_threads(1);
  model::HybridLM m(parse(model_json()));
  randomize(m, 22);
  m.train();
  auto tokens = random_tokens(2, 20, 32, 23), targets = random_tokens(2, 20, 32, 24);
  auto out = m.loss(tokens, targets);
  ASSERT_TRUE(out.indexer.defined());
  EXPECT_GT(out.indexer.item<double>(), 0.0);
  EXPECT_NEAR(
      out.total.item<double>(),
      out.main.item<double>() + 0.3 * out.mtp[0].item<double>() + out.aux.item<double>() + out.indexer.item<double>(),
      1e-5);
  // Warm-up: every A layer attends densely, so the logits are those of the same weights without DSA.
  m.set_dsa_stage(DsaStage::Warmup);
  auto j = model_json();
  j["attention"].erase("dsa_enabled");
  j["attention"].erase("dsa_start_layer");
  model::HybridLM dense(parse(j));
  {
    torch::NoGradGuard no_grad;
    auto src = m.named_parameters();
    for (auto& p : dense.named_parameters()) p.value().copy_(src[p.key()]);
  }
  m.eval();
  dense.eval();
  torch::NoGradGuard no_grad;
  EXPECT_LT(max_abs_diff(m.forward(tokens).logits, dense.forward(tokens).logits), 1e-5);
  m.set_dsa_stage(DsaStage::Sparse);
  EXPECT_GT(max_abs_diff(m.forward(tokens).logits, dense.forward(tokens).logits), 1e-4);
}

TEST(DsaModel, WarmupStepsTrainOnlyTheIndexerAndLowerItsKl) {
  torch::set_num_threads(1);
  model::HybridLM m(parse(model_json()));
  randomize(m, 25);
  m.train();
  m.set_dsa_stage(DsaStage::Warmup);
  for (auto& p : m.parameters()) p.requires_grad_(false);
  for (auto& p : m.indexer_parameters()) p.requires_grad_(true);
  torch::optim::Adam opt(m.indexer_parameters(), torch::optim::AdamOptions(1e-2));
  auto tokens = random_tokens(2, 24, 32, 26), targets = random_tokens(2, 24, 32, 27);
  const double main_before = m.loss(tokens, targets).main.item<double>();
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    auto out = m.loss(tokens, targets);
    ASSERT_TRUE(std::isfinite(out.total.item<double>()));
    (step == 0 ? first : last) = out.indexer.item<double>();
    out.total.backward();
    opt.step();
  }
  EXPECT_LT(last, 0.8 * first);
  // Dense attention and frozen weights: the language-model loss did not move.
  EXPECT_NEAR(m.loss(tokens, targets).main.item<double>(), main_before, 1e-6);
}

TEST(DsaModel, CudaMatchesTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // float64 on both sides, so both select the same keys.
  Recipe r = parse(model_json());
  model::HybridLM cpu(r, kF64);
  randomize(cpu, 28);
  model::HybridLM gpu(r, kF64.device(torch::kCUDA));
  {
    torch::NoGradGuard no_grad;
    auto from = cpu.named_parameters();
    for (auto& p : gpu.named_parameters()) p.value().copy_(from[p.key()]);
  }
  auto tokens = random_tokens(2, 26, 32, 29), targets = random_tokens(2, 26, 32, 30);
  auto ref = cpu.loss(tokens, targets);
  auto out = gpu.loss(tokens.cuda(), targets.cuda());
  EXPECT_NEAR(out.total.item<double>(), ref.total.item<double>(), 1e-9);
  EXPECT_NEAR(out.indexer.item<double>(), ref.indexer.item<double>(), 1e-9);
  out.total.backward();
  for (const auto& p : gpu.indexer_parameters()) EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
  gpu.eval();
  cpu.eval();
  torch::NoGradGuard no_grad;
  auto full = gpu.forward(tokens.cuda()).logits;
  EXPECT_LT(max_abs_diff(full.cpu(), cpu.forward(tokens).logits), 1e-9);
  auto state = gpu.new_state(2, 26);
  gpu.prefill(tokens.cuda().narrow(1, 0, 10), state);
  for (int64_t t = 10; t < 26; ++t)
    ASSERT_LT(max_abs_diff(gpu.decode(tokens.cuda().select(1, t), state).cpu(), full.select(1, t).cpu()), 1e-9) << t;
}

// The decode step's fused selection (ops::dsa_keep_step) keeps exactly the keys dsa_select_at lists (computed by
// the torch sort on the same device), for FP32 and BF16 scores with many ties, windows, local windows, ratios, a
// cache wider than one pass of the kernel's 1,024 threads, and rows at different positions.
TEST(DsaSelect, FusedKeepOnCudaIsTheSelectedSet) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(31);
  const int64_t b = 4;
  for (auto dtype : {torch::kFloat, torch::kBFloat16})
    for (int64_t capacity : {40, 2500})
      for (double ratio : {0.4, 0.5})
        for (int64_t local : {1, 5})
          for (int64_t window : {0, 37, 1500}) {
            SCOPED_TRACE(::testing::Message() << dtype << " capacity " << capacity << " ratio " << ratio << " local "
                                              << local << " window " << window);
            // ReLU-like scores: about half exact zeros, the rest small integers and halves (ties everywhere).
            auto scores = (torch::randint(-6, 7, {b, capacity}) / 2.0).clamp_min(0).to(dtype).cuda();
            ASSERT_TRUE(ops::dsa_keep_fusable(scores, local));
            for (int64_t p : {int64_t{0}, int64_t{3}, capacity / 2, capacity - 1}) {
              auto positions =
                  torch::tensor({p, (p + 11) % capacity, capacity - 1 - p / 2, p / 3}, torch::kLong).cuda();
              const auto keep = ops::dsa_keep_step(scores, positions, ratio, local, window).cpu();
              const auto index = model::dsa_select_at(scores.unsqueeze(1), positions, ratio, local, window).cpu();
              auto want = torch::zeros({b, capacity + 1}, torch::kBool);  // the last column takes the -1 slots
              want.scatter_(1, torch::where(index.squeeze(1) < 0, capacity, index.squeeze(1)), true);
              ASSERT_TRUE(torch::equal(keep, want.narrow(1, 0, capacity))) << "position " << p;
            }
          }
}

// A DSA layer's decode step on CUDA takes the fused selection and the masked decode attention (head dim 32): its
// logits equal the full forward's (the prefill path sorts and masks) and the unfused step's.
TEST(DsaModel, CudaDecodeStepAttendsTheFusedSelection) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto j = nlohmann::json::parse(R"({
    "name": "dsa-gqa", "vocab_size": 64, "d_model": 64, "depth": 2, "pattern": "A", "seq_len": 128,
    "attention": {"heads": 4, "kv_heads": 2, "head_dim": 32, "window_pattern": "SL", "short_window": 9,
                  "dsa_enabled": true, "dsa_top_k_ratio": 0.5, "dsa_local_window": 3,
                  "dsa_indexer_heads": 2, "dsa_indexer_dim": 8}
  })");
  auto m = std::make_unique<model::HybridLM>(parse(j), torch::TensorOptions().device(torch::kCUDA));
  randomize(*m, 32);
  m->eval();
  torch::NoGradGuard no_grad;
  const int64_t total = 60;
  auto tokens = random_tokens(2, total, 64, 33).cuda();
  auto full = m->forward(tokens).logits;
  ASSERT_TRUE(ops::dsa_keep_fusable(torch::zeros({2, total}, full.options()), 3));
  for (bool fused : {true, false}) {
    ops::set_fused_kernels(fused);
    auto state = m->new_state(2, total);
    m->prefill(tokens.narrow(1, 0, 20), state);
    double worst = 0;
    for (int64_t t = 20; t < total; ++t)
      worst = std::max(worst, max_abs_diff(m->decode(tokens.select(1, t), state), full.select(1, t)));
    EXPECT_LT(worst, 1e-4) << (fused ? "fused" : "unfused");
  }
  ops::set_fused_kernels(true);
}
