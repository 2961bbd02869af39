// MLA: a naive float64 per-head loop, the absorbed (decode) form against the non-absorbed one, decode == prefill
// with rollback, causality, parameter names, and the KV-cache bytes per token `slm model summary` reports.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "model/recurrent_layer_checks.h"
#include "slm/model/layers/attention.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// Layer 0 is an MLA layer with a 4-token window when `window`, full context otherwise.
nlohmann::json mla_json(int q_lora_rank, bool window) {
  auto j = nlohmann::json::parse(R"({
    "name": "mla", "vocab_size": 16, "d_model": 16, "depth": 2, "pattern": "A", "seq_len": 32,
    "attention": {"heads": 3, "kv_heads": 1, "head_dim": 4, "rope_theta": 500, "mla_layers": "all",
                  "mla": {"kv_lora_rank": 10, "qk_nope_head_dim": 4, "qk_rope_head_dim": 6, "v_head_dim": 5}}
  })");
  j["attention"]["mla"]["q_lora_rank"] = q_lora_rank;
  j["attention"]["window_pattern"] = window ? "S" : "L";
  if (window) j["attention"]["short_window"] = 4;
  return j;
}

std::shared_ptr<model::AttentionLayer> mla_layer(const Recipe& r, uint64_t seed) {
  auto plan = make_plan(r);
  auto layer = std::make_shared<model::AttentionLayer>(r, plan.layers[0], kF64);
  torch::manual_seed(seed);
  randomize(*layer, 0.3);
  torch::NoGradGuard no_grad;
  layer->mla->wo->weight.dense().normal_(0.0, 0.3);
  return layer;
}

torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w) {
  return x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-5) * w;
}

// Half-split rotation of x [n] at position p.
torch::Tensor rotate(const torch::Tensor& x, int64_t p, double theta) {
  const int64_t half = x.size(0) / 2;
  auto out = x.clone();
  for (int64_t i = 0; i < half; ++i) {
    const double a = static_cast<double>(p) * std::pow(theta, -static_cast<double>(i) / static_cast<double>(half));
    const double x1 = x[i].item<double>(), x2 = x[i + half].item<double>();
    out[i] = x1 * std::cos(a) - x2 * std::sin(a);
    out[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
  }
  return out;
}

// The MLA layer written out per head and per position, with the key of every head materialised.
torch::Tensor naive_mla(const model::AttentionLayer& layer, const torch::Tensor& x) {
  const auto& m = *layer.mla;
  const int64_t b = x.size(0), t = x.size(1), heads = m.heads, nope = m.nope_dim, rope = m.rope_dim, dv = m.v_dim;
  auto h = rms(x, layer.norm->weight);
  auto q = m.q_lora_rank > 0 ? torch::matmul(rms(torch::matmul(h, m.wq_a->weight.dense().t()), m.q_a_norm->weight),
                                             m.wq_b->weight.dense().t())
                             : torch::matmul(h, m.wq->weight.dense().t());
  q = q.view({b, t, heads, nope + rope});
  auto kv = torch::matmul(h, m.wkv_a->weight.dense().t());
  auto latent = rms(kv.narrow(2, 0, m.kv_lora_rank), m.kv_a_norm->weight);
  auto kvb = torch::matmul(latent, m.wkv_b->weight.dense().t()).view({b, t, heads, nope + dv});
  auto o = torch::zeros({b, t, heads, dv}, kF64);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t hd = 0; hd < heads; ++hd)
      for (int64_t p = 0; p < t; ++p) {
        auto qp = torch::cat({q[i][p][hd].narrow(0, 0, nope), rotate(q[i][p][hd].narrow(0, nope, rope), p, 500)});
        std::vector<double> scores;
        std::vector<int64_t> keys;
        for (int64_t s = 0; s <= p; ++s) {
          if (m.window > 0 && p - s >= m.window) continue;
          auto ks =
              torch::cat({kvb[i][s][hd].narrow(0, 0, nope), rotate(kv[i][s].narrow(0, m.kv_lora_rank, rope), s, 500)});
          scores.push_back((qp * ks).sum().item<double>() / std::sqrt(static_cast<double>(nope + rope)));
          keys.push_back(s);
        }
        const double top = *std::max_element(scores.begin(), scores.end());
        double z = 0;
        for (double& sc : scores) z += (sc = std::exp(sc - top));
        for (size_t j = 0; j < keys.size(); ++j) o[i][p][hd] += scores[j] / z * kvb[i][keys[j]][hd].narrow(0, nope, dv);
      }
  return torch::matmul(o.reshape({b, t, heads * dv}), m.wo->weight.dense().t());
}

}  // namespace

TEST(Mla, LayerMatchesNaivePerHeadLoop) {
  torch::set_num_threads(1);
  for (int q_lora : {0, 6})
    for (bool window : {false, true}) {
      auto layer = mla_layer(parse(mla_json(q_lora, window)), 1);
      ASSERT_TRUE(layer->mla);
      EXPECT_FALSE(layer->attn);
      EXPECT_EQ(layer->mla->window, window ? 4 : 0);
      auto x = torch::randn({2, 9, 16}, kF64);
      EXPECT_LT(max_rel_diff(layer->forward(x), naive_mla(*layer, x)), 1e-12)
          << "q_lora " << q_lora << " window " << window;
    }
}

TEST(Mla, AbsorbedFormEqualsNonAbsorbed) {
  torch::set_num_threads(1);
  for (int q_lora : {0, 6})
    for (bool window : {false, true}) {
      auto layer = mla_layer(parse(mla_json(q_lora, window)), 2);
      torch::NoGradGuard no_grad;
      auto h = torch::randn({2, 11, 16}, kF64);
      auto plain = layer->mla->forward(h, nullptr, false);
      EXPECT_LT(max_rel_diff(layer->mla->forward(h, nullptr, true), plain), 1e-12);
      // Through the cache: a prefill chunk in one form, the rest in the other.
      auto cache = layer->mla->make_cache(2, 11, 0);
      auto a = layer->mla->forward(h.narrow(1, 0, 6), cache.get(), true);
      auto b = layer->mla->forward(h.narrow(1, 6, 5), cache.get(), false);
      EXPECT_LT(max_rel_diff(torch::cat({a, b}, 1), plain), 1e-12);
    }
}

TEST(Mla, ParameterNamesFollowTheAccounting) {
  for (int q_lora : {0, 6}) {
    Recipe r = parse(mla_json(q_lora, false));
    auto layer = mla_layer(r, 3);
    expect_accounting_names(r, *layer, 0);
  }
}

TEST(Mla, DecodePrefillAndRollbackMatchForward) {
  for (bool window : {false, true}) {
    auto layer = mla_layer(parse(mla_json(6, window)), 4);
    expect_decode_matches_forward(*layer, 16, 24, 1e-10);
  }
}

TEST(Mla, Causal) {
  torch::set_num_threads(1);
  auto layer = mla_layer(parse(mla_json(6, false)), 5);
  expect_causal(*layer, 16, 12, 7);
}

TEST(Mla, GradientsMatchFiniteDifferences) {
  torch::set_num_threads(1);
  auto layer = mla_layer(parse(mla_json(6, true)), 6);
  expect_layer_gradcheck(*layer, 16, 7);
}

TEST(ModelSummaryCli, KvCacheBytesPerTokenByLayer) {
  // A layers 0, 2, 4: GQA, MLA, GQA with DSA (F layers between hold no cache).
  auto j = nlohmann::json::parse(R"({
    "name": "kv", "vocab_size": 32, "d_model": 16, "depth": 5, "pattern": "AF", "seq_len": 64,
    "attention": {"heads": 4, "kv_heads": 2, "head_dim": 8, "mla_layers": [2],
                  "mla": {"q_lora_rank": 0, "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                          "v_head_dim": 8},
                  "dsa_enabled": true, "dsa_layers": [4], "dsa_indexer_heads": 2, "dsa_indexer_dim": 6},
    "mlp": {"hidden": 32}
  })");
  const std::string path = testing::TempDir() + "/kv_summary_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << j.dump();
  CliResult r = run_slm("model summary --recipe " + path + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto out = nlohmann::json::parse(r.out);
  // bf16 (2 bytes): GQA keys + values 2 * kv_heads * head_dim; MLA latent + rope key; DSA adds the indexer key.
  const int64_t gqa = 2 * (2 * 2 * 8), mla = 2 * (12 + 4), dsa_gqa = gqa + 2 * 6;
  const std::vector<int64_t> expected = {gqa, 0, mla, 0, dsa_gqa};
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(out["layers"][i]["kv_cache_bytes_per_token"].get<int64_t>(), expected[i]) << "layer " << i;
  EXPECT_EQ(out["kv_cache_bytes_per_token"].get<int64_t>(), gqa + mla + dsa_gqa);
  CliResult text = run_slm("model summary --recipe " + path);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("kv cache " + std::to_string(gqa + mla + dsa_gqa) + " B per token"), std::string::npos)
      << text.out;
  unlink(path.c_str());
}
