// MTP module 1 recomputed by hand in float64 from the trunk's output (docs/architecture.md "MTP"; DeepSeek-V3
// §2.2): position i combines hnorm(h_i) with enorm(Emb(t_{i+1})), runs the module's own layers (A: GQA with
// half-split RoPE and QK-norm, full window; F: SwiGLU) as a plain residual stack, and reads out through the
// module's norm and the main LM head.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model_test_util.h"

using namespace slm;
using namespace slm::test;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// x / sqrt(mean(x²) + eps) ⊙ gain, over a 1-D vector.
torch::Tensor rms_norm_1d(const torch::Tensor& x, const torch::Tensor& gain, double eps) {
  double ms = 0;
  for (int64_t i = 0; i < x.size(0); ++i) ms += x[i].item<double>() * x[i].item<double>();
  return x / std::sqrt(ms / static_cast<double>(x.size(0)) + eps) * gain;
}

// Half-split RoPE of one head vector at position pos: pairs (j, j + hd/2), frequency theta^(-2j/hd).
torch::Tensor rope(const torch::Tensor& v, int64_t pos, double theta) {
  const int64_t hd = v.size(0), half = hd / 2;
  auto out = v.clone();
  for (int64_t j = 0; j < half; ++j) {
    const double angle =
        static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(hd));
    const double a = v[j].item<double>(), b = v[j + half].item<double>();
    out[j] = a * std::cos(angle) - b * std::sin(angle);
    out[j + half] = b * std::cos(angle) + a * std::sin(angle);
  }
  return out;
}

}  // namespace

TEST(Mtp, FirstModuleLogitsMatchAHandComputation) {
  single_threaded();
  auto j = micro_ae_json();
  j["mtp"] = {{"depth", 2}, {"pattern", "AF"}};
  Recipe r = parse(j);
  model::HybridLM m(r, kF64);
  randomize(m, 41);
  m.eval();
  torch::NoGradGuard no_grad;
  const int64_t B = 2, T = 7, H = r.attention->heads, KV = r.attention->kv_heads, hd = r.attention->head_dim,
                F = r.mlp->hidden;
  const double eps = r.norm_eps, theta = r.attention->rope_theta;
  ASSERT_TRUE(r.attention->qk_norm);
  auto tokens = random_tokens(B, T, r.vocab_size, 42);
  auto hidden = m.forward(tokens).hidden;  // the trunk's last residual stream, before the final norm
  auto got = m.mtp_logits(tokens, hidden).at(0);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{B, T - 1, r.vocab_size}));

  auto params = m.named_parameters();
  auto w = [&](const std::string& name) { return params[name]; };
  const std::string pre = "mtp.0.", a = pre + "layers.0.", f = pre + "layers.1.";
  const auto emb = w("embed.weight");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = T - 1;  // position i reads token i+1 and predicts token i+2
    std::vector<torch::Tensor> x(n);
    for (int64_t i = 0; i < n; ++i) {
      auto e = rms_norm_1d(emb[tokens[b][i + 1].item<int64_t>()], w(pre + "enorm.weight"), eps);
      auto h = rms_norm_1d(hidden[b][i], w(pre + "hnorm.weight"), eps);
      x[i] = torch::mv(w(pre + "proj.weight"), torch::cat({e, h}));  // embedding first
    }
    // Layer A: causal attention over the module's n positions (RoPE positions 0..n-1), query head q reads kv
    // head q / (H/KV); scores scaled by 1/sqrt(hd).
    std::vector<std::vector<torch::Tensor>> qs(n), ks(n), vs(n);
    for (int64_t i = 0; i < n; ++i) {
      auto in = rms_norm_1d(x[i], w(a + "norm.weight"), eps);
      auto q = torch::mv(w(a + "attn.wq.weight"), in), k = torch::mv(w(a + "attn.wk.weight"), in),
           v = torch::mv(w(a + "attn.wv.weight"), in);
      for (int64_t hh = 0; hh < H; ++hh)
        qs[i].push_back(rms_norm_1d(rope(q.narrow(0, hh * hd, hd), i, theta), w(a + "attn.q_norm.weight"), eps));
      for (int64_t hh = 0; hh < KV; ++hh) {
        ks[i].push_back(rms_norm_1d(rope(k.narrow(0, hh * hd, hd), i, theta), w(a + "attn.k_norm.weight"), eps));
        vs[i].push_back(v.narrow(0, hh * hd, hd));
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      std::vector<torch::Tensor> heads;
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kvh = hh / (H / KV);
        std::vector<double> score(i + 1);
        double mx = -INFINITY, z = 0;
        for (int64_t s = 0; s <= i; ++s) {
          score[s] = torch::dot(qs[i][hh], ks[s][kvh]).item<double>() / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, score[s]);
        }
        auto o = torch::zeros({hd}, kF64);
        for (int64_t s = 0; s <= i; ++s) {
          score[s] = std::exp(score[s] - mx);
          z += score[s];
          o += score[s] * vs[s][kvh];
        }
        heads.push_back(o / z);
      }
      x[i] = x[i] + torch::mv(w(a + "attn.wo.weight"), torch::cat(heads));
    }
    // Layer F (SwiGLU: rows [0, F) of w13 gate, [F, 2F) up), then the module's norm and the main head.
    for (int64_t i = 0; i < n; ++i) {
      auto g = torch::mv(w(f + "mlp.w13.weight"), rms_norm_1d(x[i], w(f + "norm.weight"), eps));
      auto gate = g.narrow(0, 0, F), up = g.narrow(0, F, F);
      x[i] = x[i] + torch::mv(w(f + "mlp.w2.weight"), gate / (1 + torch::exp(-gate)) * up);
      auto want = torch::mv(w("lm_head.weight"), rms_norm_1d(x[i], w(pre + "norm.weight"), eps));
      EXPECT_LT(max_abs_diff(got[b][i], want), 1e-12) << "row " << b << " position " << i;
    }
  }
}
