// mHC: Sinkhorn against a naive loop and its row/column sums, the coefficients and the stream update against
// per-position formulas, the initial model against the plain residual model, blend_alpha, causality,
// decode == prefill, and a float64 gradient check of a tiny model with mHC and Engram.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "model_test_util.h"
#include "ops/gradcheck.h"
#include "slm/ops/residual_mix.h"

using namespace slm;
using namespace slm::test;

namespace {

// micro_ae (A E A, MTP depth 2) with mHC; layers 0 and 2 learn their mix, layer 1 uses the plain one.
nlohmann::json mhc_json(int streams = 4) {
  auto j = micro_ae_json();
  j["mhc"] = {{"enabled", true}, {"streams", streams}, {"layers", {0, 2}}};
  return j;
}

// One n×n matrix of logits, row-major, by the paper's definition: exp(z - max), then iters × (columns, then
// rows), M^t = T_r(T_c(M^{t-1})).
std::vector<double> naive_sinkhorn(std::vector<double> z, int n, int iters, double eps) {
  const double mx = *std::max_element(z.begin(), z.end());
  for (auto& v : z) v = std::exp(v - mx);
  for (int it = 0; it < iters; ++it) {
    for (int c = 0; c < n; ++c) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += z[r * n + c];
      for (int r = 0; r < n; ++r) z[r * n + c] /= s + eps;
    }
    for (int r = 0; r < n; ++r) {
      double s = 0;
      for (int c = 0; c < n; ++c) s += z[r * n + c];
      for (int c = 0; c < n; ++c) z[r * n + c] /= s + eps;
    }
  }
  return z;
}

std::vector<double> values(const torch::Tensor& t) {
  auto c = t.to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// Per matrix of [..., n, n]: the largest |row sum - 1| (rows: output streams) and |column sum - 1|.
torch::Tensor row_errors(const torch::Tensor& m) {
  return (m.sum(-1) - 1).abs().amax(-1).flatten();
}
torch::Tensor column_errors(const torch::Tensor& m) {
  return (m.sum(-2) - 1).abs().amax(-1).flatten();
}

// Largest |row sum - 1| and |column sum - 1| of matrices [..., n, n].
double stochastic_error(const torch::Tensor& m) {
  return std::max(row_errors(m).max().item<double>(), column_errors(m).max().item<double>());
}

// The q-quantile of a 1-D error tensor.
double error_quantile(const torch::Tensor& e, double q) {
  auto sorted = std::get<0>(e.sort());
  return sorted[static_cast<int64_t>(q * static_cast<double>(e.size(0) - 1))].item<double>();
}

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// Copies every parameter the two models share by name (the embedding, the layers' blocks, norms, head, MTP).
void copy_shared(model::HybridLM& dst, model::HybridLM& src) {
  torch::NoGradGuard no_grad;
  auto from = src.named_parameters();
  for (auto& p : dst.named_parameters())
    if (from.contains(p.key())) p.value().copy_(from[p.key()]);
}

}  // namespace

// On the GPU without a gradient the projection is one fused kernel: equal to the float64 loops, and to the
// differentiable tensor ops (the training path) on the same device.
TEST(Mhc, CudaSinkhornKernelEqualsTheLoopsAndTheOps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(21);
  for (int n : {1, 2, 4, 8}) {
    const auto z = (torch::randn({37, n, n}) * 3).cuda();
    torch::Tensor fused;
    {
      torch::NoGradGuard no_grad;
      fused = model::sinkhorn(z, 20, 1e-6).cpu();
    }
    const auto ops = model::sinkhorn(z.clone().requires_grad_(true), 20, 1e-6).detach().cpu();
    EXPECT_LT((fused - ops).abs().max().item<double>(), 1e-6) << n;
    const auto zs = z.cpu().to(torch::kDouble).view({37, n * n}), ms = fused.to(torch::kDouble).view({37, n * n});
    for (int64_t i = 0; i < 37; ++i) {
      const auto want = naive_sinkhorn(values(zs[i]), n, 20, 1e-6);
      const auto got = values(ms[i]);
      for (int k = 0; k < n * n; ++k) ASSERT_NEAR(got[k], want[k], 1e-5) << n << ": " << i << "," << k;
    }
  }
}

// The plain mix's fused form on the GPU: X' = X + y on every stream bit for bit as the tensor ops, and X''s mean
// over the streams as torch's mean computes it (BF16: equal; FP32: the same sum in another order). The streams may
// be the embedding's expanded copies (not contiguous).
TEST(Mhc, CudaStreamAddMeanEqualsTheTensorOps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(22);
  for (auto dtype : {torch::kBFloat16, torch::kFloat}) {
    const auto o = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
    const auto x0 = torch::randn({2, 3, 96}, o);
    for (const auto& streams : {torch::randn({2, 3, 4, 96}, o), x0.unsqueeze(2).expand({2, 3, 4, 96})}) {
      const auto y = torch::randn({2, 3, 96}, o) * 3;
      ASSERT_TRUE(ops::stream_add_mean_fusable(streams, y));
      const auto [out, mean] = ops::stream_add_mean(streams, y);
      const auto want = streams + y.unsqueeze(-2);
      EXPECT_TRUE(torch::equal(out, want)) << dtype;
      if (dtype == torch::kBFloat16)
        EXPECT_TRUE(torch::equal(mean, want.mean(-2)));
      else
        EXPECT_LT((mean - want.mean(-2)).abs().max().item<double>(), 1e-6);
    }
  }
}

TEST(Mhc, SinkhornMatchesANaiveLoop) {
  single_threaded();
  torch::manual_seed(1);
  auto z = torch::randn({3, 5, 4, 4}, kF64) * 2;
  auto m = model::sinkhorn(z, 7, 1e-6);
  auto zs = z.view({-1, 16}), ms = m.reshape({-1, 16});
  for (int64_t i = 0; i < zs.size(0); ++i) {
    auto want = naive_sinkhorn(values(zs[i]), 4, 7, 1e-6);
    auto got = values(ms[i]);
    for (int k = 0; k < 16; ++k) ASSERT_NEAR(got[k], want[k], 1e-12) << i << "," << k;
  }
  // Computed in float32 at least, whatever the input.
  EXPECT_EQ(model::sinkhorn(z.to(torch::kBFloat16), 5, 1e-6).scalar_type(), torch::kFloat);
}

TEST(Mhc, HResIsDoublyStochasticAfterTheConfiguredIterations) {
  single_threaded();
  Recipe r = parse(mhc_json());
  ASSERT_EQ(r.mhc.sinkhorn_iters, 20);  // the paper's t_max (App. A) and DeepSeek-V4's
  const int iters = r.mhc.sinkhorn_iters;
  model::MhcMix mix(r, 0, kF64);
  const int64_t n = 4, D = 8;
  auto x = torch::randn({2, 16, n, D}, kF64);
  EXPECT_LT(stochastic_error(mix->coefficients(x).res), 1e-5);  // at initialisation
  {
    // A trained-looking mix: φ at unit scale per coefficient (α keeps the dynamic part near 0.01), biases moved.
    torch::NoGradGuard no_grad;
    mix->phi.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(n * D)));
    mix->bias.add_(torch::randn_like(mix->bias) * 0.05);
  }
  auto res = mix->coefficients(x).res;
  EXPECT_LT(stochastic_error(res), 1e-5);
  EXPECT_GT((res - 1.0 / n).abs().max().item<double>(), 1e-3);  // and it is not the uniform start
  EXPECT_TRUE((res >= 0).all().item<bool>());

  // Why H_res starts uniform (mhc.cpp): near a permutation (logits 4·I) the columns miss by far more.
  auto near_identity = torch::eye(4, kF64) * 4 + torch::randn({1000, 4, 4}, kF64) * 0.01;
  EXPECT_GT(stochastic_error(model::sinkhorn(near_identity, iters, 1e-6)), 1e-4);
  EXPECT_LT(stochastic_error(model::sinkhorn(torch::randn({1000, 4, 4}, kF64) * 0.1, iters, 1e-6)), 1e-5);
}

// Rows (output streams) are normalised last, so they are exact after any number of iterations and for any
// logits: every output stream is a convex combination of the inputs. The columns converge at a rate set by the
// logits' spread; docs/recipes.md quotes these measurements.
TEST(Mhc, SinkhornRowsAreExactAndColumnsConvergeWithIterations) {
  single_threaded();
  const int iters = parse(mhc_json()).mhc.sinkhorn_iters;
  torch::manual_seed(3);
  const std::vector<std::pair<std::string, torch::Tensor>> spreads = {
      {"std 1", torch::randn({1000, 4, 4}, kF64)},
      {"std 2", torch::randn({1000, 4, 4}, kF64) * 2},
      {"4I + std 0.5", torch::eye(4, kF64) * 4 + torch::randn({1000, 4, 4}, kF64) * 0.5}};
  for (const auto& [name, z] : spreads) {
    for (int it : {5, iters}) {
      auto m = model::sinkhorn(z, it, 1e-6);
      auto rows = row_errors(m), cols = column_errors(m);
      std::printf("[ sinkhorn ] %-13s %2d iterations: rows max %.1e | columns median %.1e, 99%% %.1e, max %.1e\n",
                  name.c_str(), it, rows.max().item<double>(), error_quantile(cols, 0.5), error_quantile(cols, 0.99),
                  cols.max().item<double>());
      // ε = 1e-6 in each divisor leaves the rows a few 1e-6 short of 1.
      EXPECT_LT(rows.max().item<double>(), 1e-5) << name << ", " << it << " iterations";
    }
    // Enough iterations make the columns exact as well.
    EXPECT_LT(column_errors(model::sinkhorn(z, 400, 1e-6)).max().item<double>(), 1e-5) << name;
  }
  // Logits of std 1 (the example): 5 iterations leave the columns off by several percent, the default
  // brings all of them within 1e-3.
  const auto& std1 = spreads[0].second;
  EXPECT_GT(column_errors(model::sinkhorn(std1, 5, 1e-6)).max().item<double>(), 1e-2);
  EXPECT_LT(column_errors(model::sinkhorn(std1, iters, 1e-6)).max().item<double>(), 1e-3);
}

// Per position: x̂ = vec(X)/rms, h = φ x̂, H_pre = σ(α0 h_pre + b), H_post = 2σ(α1 h_post + b),
// H_res = Sinkhorn((α2 h_res + b)/τ); X'[j] = H_post[j]·F(Σ_i H_pre[i] X[i]) + Σ_i H_res[j,i] X[i].
TEST(Mhc, LayerUpdateMatchesThePerPositionFormula) {
  single_threaded();
  auto j = mhc_json(3);
  j["mhc"]["temperature"] = 0.7;
  j["mhc"]["sinkhorn_iters"] = 9;
  Recipe r = parse(j);
  model::MhcMix mix(r, 1, kF64);
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(2);
    for (auto& p : mix->parameters()) p.normal_(0.0, 0.5);
  }
  const int64_t n = 3, D = 8, T = 4;
  auto x = torch::randn({1, T, n, D}, kF64);
  auto block = [](const torch::Tensor& u) { return torch::tanh(u) * 1.5; };
  auto out = mix->forward(x, block);

  const auto phi = mix->phi, b = mix->bias;
  const double a0 = mix->alpha[0].item<double>(), a1 = mix->alpha[1].item<double>(), a2 = mix->alpha[2].item<double>();
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  for (int64_t t = 0; t < T; ++t) {
    auto flat = x[0][t].reshape({-1});
    auto xhat = flat / std::sqrt((flat * flat).mean().item<double>() + r.norm_eps);
    auto h = values(torch::mv(phi, xhat));
    auto bias = values(b);
    std::vector<double> pre(n), post(n), logits(n * n);
    for (int i = 0; i < n; ++i) {
      pre[i] = sig(a0 * h[i] + bias[i]);
      post[i] = 2 * sig(a1 * h[n + i] + bias[n + i]);
    }
    for (int k = 0; k < n * n; ++k) logits[k] = (a2 * h[2 * n + k] + bias[2 * n + k]) / 0.7;
    auto res = naive_sinkhorn(logits, n, 9, r.mhc.epsilon);
    auto u = torch::zeros({D}, kF64);
    for (int i = 0; i < n; ++i) u += pre[i] * x[0][t][i];
    auto y = block(u);
    for (int jj = 0; jj < n; ++jj) {
      auto want = post[jj] * y;
      for (int i = 0; i < n; ++i) want = want + res[jj * n + i] * x[0][t][i];
      EXPECT_LT(max_abs_diff(out[0][t][jj], want), 1e-12) << t << "," << jj;
    }
  }
}

TEST(Mhc, InitialModelIsThePlainResidualModel) {
  single_threaded();
  model::HybridLM plain(parse(micro_ae_json())), mhc(parse(mhc_json()));
  randomize(plain, 31);
  {
    torch::NoGradGuard no_grad;
    plain.resid_lambdas.fill_(1.0);
    plain.x0_lambdas.fill_(0.0);
  }
  copy_shared(mhc, plain);
  EXPECT_FALSE(mhc.resid_lambdas.defined());
  plain.eval();
  mhc.eval();
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(2, 11, 13, 5);
  auto p = plain.forward(tokens), m = mhc.forward(tokens);
  // Relative: the Sinkhorn epsilon leaves H_res rows a few 1e-6 short of 1.
  auto rel = [](const torch::Tensor& a, const torch::Tensor& ref) {
    return max_abs_diff(a, ref) / ref.abs().max().item<double>();
  };
  EXPECT_LT(rel(m.logits, p.logits), 2e-5);
  EXPECT_LT(rel(m.hidden, p.hidden), 2e-5);
  auto pm = plain.mtp_logits(tokens, p.hidden), mm = mhc.mtp_logits(tokens, m.hidden);
  ASSERT_EQ(mm.size(), 2u);
  for (size_t k = 0; k < 2; ++k) EXPECT_LT(rel(mm[k], pm[k]), 2e-5);
  // The mix is live: moving the learned parts moves the output.
  for (auto& q : mhc.named_parameters())
    if (q.key().find("mhc") != std::string::npos) q.value().add_(torch::randn_like(q.value()) * 0.5);
  EXPECT_GT(max_abs_diff(mhc.forward(tokens).logits, p.logits), 1e-3);
}

TEST(Mhc, BlendAlphaInterpolatesBetweenThePlainAndTheLearnedMix) {
  single_threaded();
  auto learned_model = [](double beta) {
    auto j = mhc_json();
    j["mhc"]["blend_alpha"] = beta;
    auto m = std::make_unique<model::HybridLM>(parse(j));
    randomize(*m, 32);  // the same values for every beta
    m->eval();
    return m;
  };
  auto zero = learned_model(0.0), half = learned_model(0.5), one = learned_model(1.0);
  model::HybridLM plain(parse(micro_ae_json()));
  copy_shared(plain, *zero);
  {
    torch::NoGradGuard no_grad;
    plain.resid_lambdas.fill_(1.0);
    plain.x0_lambdas.fill_(0.0);
  }
  plain.eval();
  torch::NoGradGuard no_grad;
  auto tokens = random_tokens(1, 9, 13, 6);
  // beta = 0 is the plain residual network whatever the learned parameters hold.
  EXPECT_LT(max_abs_diff(zero->forward(tokens).logits, plain.forward(tokens).logits), 1e-5);
  EXPECT_GT(max_abs_diff(one->forward(tokens).logits, plain.forward(tokens).logits), 1e-3);
  // beta = 0.5: every coefficient is the midpoint of the plain and the learned one.
  auto x = torch::randn({1, 3, 4, 8});
  auto c_half = half->mhc_layers()[0]->coefficients(x), c_one = one->mhc_layers()[0]->coefficients(x);
  EXPECT_LT(max_abs_diff(c_half.pre, 0.5 * c_one.pre + 0.5 / 4), 1e-6);
  EXPECT_LT(max_abs_diff(c_half.post, 0.5 * c_one.post + 0.5), 1e-6);
  EXPECT_LT(max_abs_diff(c_half.res, 0.5 * c_one.res + 0.5 * torch::eye(4)), 1e-6);
}

TEST(Mhc, CausalAndDecodeMatchesTheForward) {
  single_threaded();
  model::HybridLM m(parse(mhc_json()));
  randomize(m, 33);
  m.eval();
  torch::NoGradGuard no_grad;
  const int64_t total = 16;
  auto a = random_tokens(2, total, 13, 7);
  auto full = m.forward(a).logits;
  auto b = a.clone();
  b.select(1, 9).copy_((a.select(1, 9) + 1) % 13);
  auto lb = m.forward(b).logits;
  EXPECT_LT(max_abs_diff(full.narrow(1, 0, 9), lb.narrow(1, 0, 9)), 1e-6);
  EXPECT_GT(max_abs_diff(full.narrow(1, 9, 1), lb.narrow(1, 9, 1)), 1e-4);

  auto state = m.new_state(2, total, 2);
  EXPECT_LT(max_abs_diff(m.prefill(a.narrow(1, 0, 6), state), full.narrow(1, 0, 6)), 1e-4);
  for (int64_t t = 6; t < total; ++t) EXPECT_LT(max_abs_diff(m.decode(a.select(1, t), state), full.select(1, t)), 1e-4);
  // MTP drafting reads the collapsed hidden the state kept.
  state.rollback(1);
  auto drafts = m.draft(state, a.select(1, total - 1));
  auto l1 = m.mtp_logits(a, m.forward(a).hidden)[0];
  EXPECT_TRUE(torch::equal(drafts.select(1, 0), l1.select(1, total - 2).argmax(-1)));
}

// Central differences in float64 against autograd along random directions over every parameter of a micro
// model with mHC (2 streams, one learned and two plain layers), Engram on both A layers and two MTP modules.
TEST(Mhc, GradientCheckWithEngramFloat64) {
  single_threaded();
  auto j = mhc_json(2);
  j["engram"] = {{"enabled", true}, {"layers", {0, 2}}, {"orders", "2,3"}, {"heads_per_order", 2},
                 {"table_rows", 5}, {"embed_dim", 3},   {"conv_kernel", 2}};
  j["mhc"]["layers"] = nlohmann::json::array({1});
  model::HybridLM m(parse(j), kF64);
  randomize(m, 34);
  m.train();
  auto tokens = random_tokens(2, 7, 13, 8), targets = random_tokens(2, 7, 13, 9);
  auto loss = [&] { return m.loss(tokens, targets).total; };
  std::vector<torch::Tensor> leaves;
  for (auto& p : m.parameters()) leaves.push_back(p);
  expect_gradcheck(loss, leaves, 4);
  // Every parameter is reached by the loss.
  loss().backward();
  for (const auto& p : m.named_parameters())
    EXPECT_TRUE(p.value().grad().defined() && p.value().grad().abs().sum().item<double>() > 0) << p.key();
}

// Why H_pre leans on stream (layer mod n) at initialisation: from a fully symmetric start every stream gets the
// same update and the n streams stay one stream; the leaning start makes H_post (and so the streams) diverge.
TEST(Mhc, LeaningReadsLetTheStreamsDivergeUnderTraining) {
  single_threaded();
  model::HybridLM trained(parse(micro_ae_json()));
  randomize(trained, 35);  // blocks that already compute something, so H_post gets a gradient at once
  auto post_spread_after_training = [&](bool symmetric) {
    model::HybridLM m(parse(mhc_json()));
    copy_shared(m, trained);
    const int64_t n = 4;
    if (symmetric) {
      torch::NoGradGuard no_grad;
      for (const auto& mix : m.mhc_layers())
        if (!mix.is_empty()) mix->bias.narrow(0, 0, n).fill_(std::log(1.0 / (n - 1)));  // σ = 1/n
    }
    torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(0.05));
    auto tokens = random_tokens(2, 12, 13, 11), targets = random_tokens(2, 12, 13, 12);
    double first = 0, last = 0;
    for (int step = 0; step < 4; ++step) {
      opt.zero_grad();
      auto loss = m.loss(tokens, targets).total;
      (step == 0 ? first : last) = loss.item<double>();
      loss.backward();
      opt.step();
    }
    EXPECT_LT(last, first);
    auto post = m.mhc_layers()[0]->bias.narrow(0, n, n);
    return (post.max() - post.min()).item<double>();
  };
  const double leaning = post_spread_after_training(false), symmetric = post_spread_after_training(true);
  EXPECT_GT(leaning, 1e-4);
  EXPECT_LT(symmetric, 1e-7);
}
