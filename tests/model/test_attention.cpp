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
    if (p.dim() == 2)
      p.normal_(0.0, 0.3);
    else
      p.normal_(1.0, 0.1);
  return layer;
}

}  // namespace

TEST(Attention, SdpaMatchesPlainReference) {
  single_threaded();
  torch::manual_seed(0);
  // Full causal, windowed, GQA and MHA, query blocks that end a longer key sequence (prefill after a
  // cache, one-token decode).
  for (Case c : std::vector<Case>{{4, 2, 12, 12, 0},
                                  {4, 2, 12, 12, 5},
                                  {4, 4, 9, 9, 3},
                                  {6, 2, 3, 10, 0},
                                  {6, 2, 3, 10, 4},
                                  {4, 1, 1, 9, 0},
                                  {4, 1, 1, 9, 3},
                                  {2, 2, 5, 5, 40}}) {
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
    auto q = torch::matmul(h, a.wq->weight.dense().t()).view({2, 11, 4, 8});
    auto k = torch::matmul(h, a.wk->weight.dense().t()).view({2, 11, 2, 8});
    auto v = torch::matmul(h, a.wv->weight.dense().t()).view({2, 11, 2, 8});
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
    auto expected = torch::matmul(o, a.wo->weight.dense().t());
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
  const model::Rope rope(8, 1000.0);
  auto score = [&](int64_t pq, int64_t pk) {
    return (rope(q, {pq, {}, pq + 1}) * rope(k, {pk, {}, pk + 1})).sum().item<double>();
  };
  EXPECT_NEAR(score(5, 2), score(105, 102), 1e-4);
  EXPECT_NEAR(score(7, 7), (q * k).sum().item<double>(), 1e-5);
}

namespace {

// x rotated by the angle p * theta^(-2i/dim) of pair (i, i + dim/2), computed in double with the C library.
torch::Tensor rotate_by_hand(const torch::Tensor& x, const std::vector<int64_t>& pos, double theta) {
  auto in = x.to(torch::kDouble).contiguous();
  auto out = in.clone();
  const int64_t t = x.size(1), heads = x.size(2), half = x.size(3) / 2;
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t j = 0; j < t; ++j)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double a = static_cast<double>(pos[b * t + j]) * std::pow(theta, -2.0 * i / (2.0 * half));
          const double x1 = in[b][j][h][i].item<double>(), x2 = in[b][j][h][i + half].item<double>();
          out[b][j][h][i] = x1 * std::cos(a) - x2 * std::sin(a);
          out[b][j][h][i + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
  return out;
}

}  // namespace

TEST(Rope, CachedTablesEqualAFloat64HandComputation) {
  single_threaded();
  const double theta = 100000.0;
  const model::Rope rope(8, theta);
  torch::manual_seed(4);
  auto x = torch::randn({2, 5, 3, 8}, torch::kDouble);
  auto run_from = [](int64_t start) {
    std::vector<int64_t> p;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = 0; j < 5; ++j) p.push_back(start + j);
    return p;
  };
  // Runs from a cache's length: the first builds the float64 tables (256 rows), the second crosses their end, so
  // they are rebuilt longer.
  EXPECT_LT(max_abs_diff(rope(x, {0, {}, 5}), rotate_by_hand(x, run_from(0), theta)), 1e-12);
  EXPECT_LT(max_abs_diff(rope(x, {253, {}, 258}), rotate_by_hand(x, run_from(253), theta)), 1e-12);
  // The tables hold cos/sin of every position below their size, as a float64 loop computes them.
  auto [cos, sin] = rope.tables(torch::kCPU, torch::kDouble, 258);
  ASSERT_GE(cos.size(0), 258);
  for (int64_t p : {0, 1, 7, 255, 256, 257})
    for (int64_t i = 0; i < 4; ++i) {
      const double a = static_cast<double>(p) * std::pow(theta, -2.0 * i / 8.0);
      EXPECT_NEAR(cos[p][i].item<double>(), std::cos(a), 1e-12) << p << " " << i;
      EXPECT_NEAR(sin[p][i].item<double>(), std::sin(a), 1e-12) << p << " " << i;
    }
  // Per-token positions (packed documents), in float64 and in float32: at 100,000 angles formed in float32 would
  // be ~1e-2 rad off.
  const std::vector<int64_t> scattered = {0, 3, 1, 99999, 4, 17, 2, 60000, 5, 0};
  const auto ids = torch::tensor(scattered, torch::kLong).view({2, 5});
  EXPECT_LT(max_abs_diff(rope(x, {0, ids, 100000}), rotate_by_hand(x, scattered, theta)), 1e-12);
  EXPECT_LT(max_abs_diff(rope(x.to(torch::kFloat), {0, ids, 100000}), rotate_by_hand(x, scattered, theta)), 1e-5);
  // Once built, a table serves every shorter request without being rebuilt.
  auto built = rope.tables(torch::kCPU, torch::kFloat, 100000).first;
  EXPECT_EQ(rope.tables(torch::kCPU, torch::kFloat, 12).first.data_ptr(), built.data_ptr());
  EXPECT_THROW(model::Rope(7, theta), Error);
}
