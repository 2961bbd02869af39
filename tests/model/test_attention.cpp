// Attention: the SDPA path against the plain matmul-softmax reference, the layer against a hand-built
// pipeline on that reference, and sliding windows.
#include "model_test_util.h"
#include "slm/model/layers/attention.h"
#include "slm/ops/attention.h"

using namespace slm;
using namespace slm::test;

namespace {

struct Case {
  int64_t heads, kv_heads, t, s, window;
};

Recipe attention_recipe(int64_t window) {
  auto j = nlohmann::json::parse(R"({
    "name": "a", "vocab_size": 16, "d_model": 16, "depth": 2, "pattern": "A", "seq_len": 32,
    "attention": {"heads": 4, "kv_heads": 2, "head_dim": 8, "rope_theta": 500}
  })");
  if (window > 0) {
    j["attention"]["window_pattern"] = "S";
    j["attention"]["short_window"] = window;
  }
  return parse(j);
}

std::shared_ptr<model::AttentionLayer> random_layer(int64_t window, uint64_t seed) {
  Recipe r = attention_recipe(window);
  auto plan = make_plan(r);
  auto layer = std::make_shared<model::AttentionLayer>(r, plan.layers[0], torch::TensorOptions());
  EXPECT_EQ(layer->attn->window, window);
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : layer->parameters())
    if (p.dim() == 2) p.normal_(0.0, 0.3);
    else p.normal_(1.0, 0.1);
  return layer;
}

}  // namespace

TEST(Attention, SdpaMatchesPlainReference) {
  single_threaded();
  torch::manual_seed(0);
  // Full causal, windowed, GQA and MHA, query blocks that end a longer key sequence (prefill after a
  // cache, one-token decode).
  for (Case c : std::vector<Case>{{4, 2, 12, 12, 0}, {4, 2, 12, 12, 5}, {4, 4, 9, 9, 3}, {6, 2, 3, 10, 0},
                                  {6, 2, 3, 10, 4}, {4, 1, 1, 9, 0}, {4, 1, 1, 9, 3}, {2, 2, 5, 5, 40}}) {
    auto q = torch::randn({2, c.heads, c.t, 8});
    auto k = torch::randn({2, c.kv_heads, c.s, 8});
    auto v = torch::randn({2, c.kv_heads, c.s, 8});
    double diff = max_abs_diff(ops::causal_attention(q, k, v, c.window), ops::causal_attention_ref(q, k, v, c.window));
    EXPECT_LT(diff, 1e-5) << "H=" << c.heads << " KV=" << c.kv_heads << " T=" << c.t << " S=" << c.s
                          << " window=" << c.window;
  }
}

TEST(Attention, MaskSeesExactlyTheWindow) {
  single_threaded();
  auto m = ops::causal_mask(3, 8, 4, torch::kCPU);  // queries at positions 5, 6, 7
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t p = 5 + i;
      EXPECT_EQ(m[i][j].item<bool>(), j <= p && p - j < 4) << i << "," << j;
    }
}

TEST(Attention, LayerMatchesPipelineOnPlainReference) {
  single_threaded();
  for (int64_t window : {0, 5}) {
    auto layer = random_layer(window, 1);
    auto& a = *layer->attn;
    auto x = torch::randn({2, 11, 16});
    // RoPE (half split) then QK-norm, GQA by repeating kv heads, plain softmax attention.
    auto h = at::rms_norm(x, {16}, layer->norm->weight, 1e-5);
    auto q = torch::matmul(h, a.wq->weight.t()).view({2, 11, 4, 8});
    auto k = torch::matmul(h, a.wk->weight.t()).view({2, 11, 2, 8});
    auto v = torch::matmul(h, a.wv->weight.t()).view({2, 11, 2, 8});
    auto pos = torch::arange(11, torch::kDouble).view({1, 11, 1, 1});
    auto freq = torch::pow(500.0, -torch::arange(4, torch::kDouble) / 4.0).view({1, 1, 1, 4});
    auto rot = [&](const torch::Tensor& t) {
      auto ang = (pos * freq);
      auto c = ang.cos().to(torch::kFloat), s = ang.sin().to(torch::kFloat);
      auto t1 = t.narrow(3, 0, 4), t2 = t.narrow(3, 4, 4);
      return torch::cat({t1 * c - t2 * s, t1 * s + t2 * c}, 3);
    };
    auto rms = [](const torch::Tensor& t, const torch::Tensor& w) {
      return t * torch::rsqrt(t.pow(2).mean(-1, true) + 1e-5) * w;
    };
    q = rms(rot(q), a.q_norm->weight).transpose(1, 2);
    k = rms(rot(k), a.k_norm->weight).transpose(1, 2);
    auto o = ops::causal_attention_ref(q, k, v.transpose(1, 2), window).transpose(1, 2).reshape({2, 11, 32});
    auto expected = torch::matmul(o, a.wo->weight.t());
    EXPECT_LT(max_abs_diff(layer->forward(x), expected), 1e-5) << "window " << window;
  }
}

TEST(Attention, WindowedLayerIgnoresKeysOutsideItsWindow) {
  single_threaded();
  const int64_t w = 4, t = 16, changed_before = 6;
  auto windowed = random_layer(w, 2);
  auto full = random_layer(0, 2);
  auto x = torch::randn({1, t, 16});
  auto y = x.clone();
  y.narrow(1, 0, changed_before).normal_();  // positions 0..5 change
  auto a = windowed->forward(x), b = windowed->forward(y);
  // A query at p sees p-w+1..p: from p = changed_before + w - 1 on, no changed key is in view.
  const int64_t first_blind = changed_before + w - 1;
  EXPECT_LT(max_abs_diff(a.narrow(1, first_blind, t - first_blind), b.narrow(1, first_blind, t - first_blind)), 1e-6);
  EXPECT_GT(max_abs_diff(a.narrow(1, first_blind - 1, 1), b.narrow(1, first_blind - 1, 1)), 1e-4);
  // The same weights with full context do see the change at the last position.
  EXPECT_GT(max_abs_diff(full->forward(x).narrow(1, t - 1, 1), full->forward(y).narrow(1, t - 1, 1)), 1e-4);
}

TEST(Attention, RopeScoresDependOnlyOnDistance) {
  single_threaded();
  torch::manual_seed(3);
  auto q = torch::randn({1, 1, 1, 8}), k = torch::randn({1, 1, 1, 8});
  auto score = [&](int64_t pq, int64_t pk) {
    return (model::apply_rope(q, pq, 1000.0) * model::apply_rope(k, pk, 1000.0)).sum().item<double>();
  };
  EXPECT_NEAR(score(5, 2), score(105, 102), 1e-4);
  EXPECT_NEAR(score(7, 7), (q * k).sum().item<double>(), 1e-5);
}
