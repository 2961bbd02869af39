// The decode step's fused CUDA kernels against the tensor ops they replace and plain float64 loops: the rotary
// embedding + QK-norm (ops/rotary_norm.h), the MoE routing and the assignments' order by expert (ops/moe_route.h),
// the residual mix (ops/residual_mix.h, also its training form) and the routed experts read in place
// (ops/gathered_linear.h). Each runs only on a CUDA device; the CPU build keeps the tensor ops.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <vector>

#include "slm/model/documents.h"
#include "slm/model/layers/attention.h"
#include "slm/model/layers/moe.h"
#include "slm/model/layers/rope.h"
#include "slm/ops/fused_kernels.h"
#include "slm/ops/gathered_linear.h"
#include "slm/ops/moe_route.h"
#include "slm/ops/residual_mix.h"
#include "slm/ops/rms_norm.h"
#include "slm/ops/rotary_norm.h"
#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/recipe/plan.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

namespace {

std::vector<double> host(const torch::Tensor& t) {
  auto d = t.detach().cpu().to(torch::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

}  // namespace

// Rotation alone equals model::Rope bit for bit (the kernel rounds where the ops round); with the weight it equals
// Rope then ops::rms_norm to a rounding of the dtype, and both equal a float64 loop over the same tables.
TEST(DecodeFusionsCuda, RotaryNormEqualsRopeThenRmsNormAndTheFloat64Loop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  const auto dev = torch::Device(torch::kCUDA);
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    for (int64_t dim : {64, 128}) {
      const int64_t b = 3, heads = 5, cap = 1500;
      const model::Rope rope(dim, 100000.0);
      const auto [cos, sin] = rope.tables(dev, dt, cap);
      const auto x = (torch::randn({b, heads, dim}) * 2).to(dev, dt);
      const auto at = torch::tensor({0L, 17L, 1499L}, torch::TensorOptions().dtype(torch::kLong).device(dev));
      const auto w = (torch::rand({dim}) + 0.5).to(dev, dt);
      ASSERT_TRUE(ops::rotary_norm_fusable(x, cos, w));
      const model::RotaryPositions pos{0, at.view({b, 1}), cap};
      const auto rotated = rope(x.unsqueeze(1), pos).squeeze(1);
      const auto fused_rot = ops::rotary_norm_step(x, at, cos, sin, torch::Tensor(), 0.0);
      EXPECT_TRUE(torch::equal(fused_rot, rotated)) << dt << " " << dim;

      const auto fused = ops::rotary_norm_step(x, at, cos, sin, w, 1e-6);
      const auto ops_ref = ops::rms_norm(rotated, w, 1e-6);
      const double tol = dt == torch::kFloat ? 1e-5 : 1.6e-2;  // BF16: an ulp or two of values near 2
      EXPECT_LT((fused.to(torch::kFloat) - ops_ref.to(torch::kFloat)).abs().max().item<double>(), tol) << dt;

      // float64: the pairs (i, i + half) rotated by the tables' cos and sin at each row's position, then normalized.
      const auto xs = host(x), cs = host(cos), ss = host(sin), ws = host(w), got = host(fused);
      const int64_t half = dim / 2;
      const std::vector<int64_t> p = {0, 17, 1499};
      for (int64_t r = 0; r < b; ++r)
        for (int64_t h = 0; h < heads; ++h) {
          const double* v = xs.data() + (r * heads + h) * dim;
          std::vector<double> y(dim);
          for (int64_t i = 0; i < half; ++i) {
            const double c = cs[p[r] * half + i], s = ss[p[r] * half + i];
            y[i] = v[i] * c - v[i + half] * s;
            y[i + half] = v[i + half] * c + v[i] * s;
          }
          double sq = 0;
          for (double e : y) sq += e * e;
          const double inv = 1.0 / std::sqrt(sq / dim + 1e-6);
          for (int64_t i = 0; i < dim; ++i)
            ASSERT_NEAR(got[(r * heads + h) * dim + i], y[i] * inv * ws[i], dt == torch::kFloat ? 1e-4 : 4e-2)
                << dt << " row " << r << " head " << h << " dim " << i;
        }
    }
  }
}

// The fused routing selects what model::route selects, in its order, with its gate weights; both equal a float64
// selection. Expert counts below, at and above a warp's multiple, top-1 to top-8.
TEST(DecodeFusionsCuda, FusedRoutingEqualsRouteAndTheFloat64Selection) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  for (int64_t e : {8, 16, 40, 128, 256}) {
    for (int64_t k : {1, 2, 4, 8}) {
      if (k > e) continue;
      const int64_t n = 37;
      const auto logits = (torch::randn({n, e}) * 2).cuda();
      const auto bias = (torch::randn({e}) * 0.1).cuda();
      ASSERT_TRUE(ops::moe_route_fusable(logits, k));
      const auto [experts, weights] = ops::moe_route_fused(logits, bias, k, 2.5);
      const auto ref = model::route(logits, bias, k, 2.5);
      EXPECT_TRUE(torch::equal(experts, ref.experts)) << e << " top-" << k;
      EXPECT_LT((weights - ref.weights).abs().max().item<double>(), 1e-6) << e << " top-" << k;

      const auto ls = host(logits), bs = host(bias), ws = host(weights);
      const auto xs = experts.cpu();
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> score(e), biased(e);
        for (int64_t j = 0; j < e; ++j) {
          score[j] = 1.0 / (1.0 + std::exp(-ls[t * e + j]));
          biased[j] = score[j] + bs[j];
        }
        std::vector<int64_t> order(e);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return biased[a] > biased[c]; });
        double total = 0;
        for (int64_t s = 0; s < k; ++s) total += score[order[s]];
        for (int64_t s = 0; s < k; ++s) {
          ASSERT_EQ(xs[t][s].item<int64_t>(), order[s]) << e << " top-" << k << " token " << t;
          ASSERT_NEAR(ws[t * k + s], score[order[s]] / total * 2.5, 2e-6);
        }
      }
    }
  }
}

// An MoE layer outside training routes with the fused kernel: its output equals the same layer routing with the
// tensor ops (training mode), and its router statistics count the same selections.
// The order by expert equals a stable sort written out on the host: the permutation, its inverse, the tokens and the
// running counts, for a single token up to the kernel's 2,048 assignments, experts a warp multiple or not, and ids
// that leave some experts without rows.
TEST(DecodeFusionsCuda, ExpertOrderEqualsTheHostsStableSort) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(9);
  for (const auto& [n, k, e] : {std::tuple<int64_t, int64_t, int64_t>{1, 4, 16},
                                {5, 2, 40},
                                {64, 4, 16},
                                {64, 8, 128},
                                {300, 6, 7},
                                {256, 8, 1024}}) {
    const auto ids = torch::randint(e, {n, k}, torch::kLong);
    ASSERT_TRUE(ops::expert_order_fusable(ids.cuda(), e));
    const auto [order, inv, token, ends] = ops::expert_order_fused(ids.cuda(), e);
    const auto* v = ids.data_ptr<int64_t>();
    std::vector<int64_t> want(static_cast<size_t>(n * k));
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(), [&](int64_t a, int64_t b) { return v[a] < v[b]; });
    std::vector<int64_t> want_inv(want.size()), want_token(want.size()), want_ends(static_cast<size_t>(e), 0);
    for (size_t at = 0; at < want.size(); ++at) {
      want_inv[static_cast<size_t>(want[at])] = static_cast<int64_t>(at);
      want_token[at] = want[at] / k;
      for (int64_t x = v[want[at]]; x < e; ++x) ++want_ends[static_cast<size_t>(x)];
    }
    const auto as_vec = [](const torch::Tensor& t) {
      auto c = t.cpu().to(torch::kLong).contiguous();
      return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    };
    EXPECT_EQ(as_vec(order), want) << n << "x" << k << " over " << e;
    EXPECT_EQ(as_vec(inv), want_inv) << n << "x" << k << " over " << e;
    EXPECT_EQ(as_vec(token), want_token) << n << "x" << k << " over " << e;
    EXPECT_EQ(as_vec(ends), want_ends) << n << "x" << k << " over " << e;
    EXPECT_EQ(ends.scalar_type(), torch::kInt);
  }
  EXPECT_FALSE(ops::expert_order_fusable(torch::zeros({2049, 1}, torch::kLong).cuda(), 16));
  EXPECT_FALSE(ops::expert_order_fusable(torch::zeros({4, 2}, torch::kLong), 16));  // the CPU keeps the sort
}

TEST(DecodeFusionsCuda, MoeLayerOutsideTrainingGivesTheTrainingModeOutput) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  auto j = nlohmann::json::parse(R"({
    "name": "e", "vocab_size": 16, "d_model": 64, "depth": 1, "pattern": "E", "seq_len": 32,
    "moe": {"routed_experts": 16, "experts_per_token": 4, "expert_hidden": 32, "shared_experts": 1,
            "shared_expert_hidden": 32, "routed_scaling_factor": 1.5}
  })");
  model::MoE m(parse(j), torch::TensorOptions().device(torch::kCUDA));
  m->expert_bias.copy_(torch::randn({16}) * 0.05);
  for (auto& p : m->parameters()) p.normal_(0.0, 0.2);
  const auto h = torch::randn({2, 3, 64}).cuda();
  m->train();
  const auto trained = m->forward(h);
  const auto train_load = m->last_stats().load;
  m->eval();
  const auto evaluated = m->forward(h);
  EXPECT_LT((evaluated - trained).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(m->last_stats().load, train_load);
}

// r * x + b * x0 and r * (x + y) + b * x0 in one kernel equal the tensor ops bit for bit, in each dtype, on odd
// lengths.
TEST(DecodeFusionsCuda, ResidualMixEqualsTheTensorOpsBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t n : {1, 1023, 4096 * 3 + 5}) {
      const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      const auto x = torch::randn({n}).to(o), x0 = torch::randn({n}).to(o);
      // r and b are elements of one parameter, as the model's lambdas are.
      const auto lambdas = torch::tensor({1.13, 0.17, 0.9}).to(o);
      const auto got = ops::residual_mix(x, torch::Tensor(), lambdas[0], x0, lambdas[1]);
      const auto want = lambdas[0] * x + lambdas[1] * x0;
      EXPECT_TRUE(torch::equal(got, want)) << dt << " " << n;
      // With the previous layer's output added first.
      const auto y = torch::randn({n}).to(o);
      EXPECT_TRUE(
          torch::equal(ops::residual_mix(x, y, lambdas[0], x0, lambdas[1]), lambdas[0] * (x + y) + lambdas[1] * x0))
          << dt << " " << n;
      const auto xs = host(x), x0s = host(x0), gs = host(got), ls = host(lambdas);
      for (int64_t i = 0; i < n; i += 97)
        ASSERT_NEAR(gs[i], ls[0] * xs[i] + ls[1] * x0s[i], dt == torch::kFloat ? 1e-5 : 3e-2) << dt << " " << i;
    }
  }
}

// Training's mix (an FP32 stream, the block output in BF16 or FP32, the lambdas as parameters) runs one kernel each
// way: the output and the gradients of x, y and x0 equal the tensor ops' bit for bit (the same roundings), and the
// lambdas' gradients, sums over every element, equal float64 sums.
TEST(DecodeFusionsCuda, ResidualMixTrainsWithTheTensorOpsGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(16);
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  for (auto ydt : {torch::kBFloat16, torch::kFloat, torch::kFloat64}) {  // kFloat64: no y (the first layer)
    const bool with_y = ydt != torch::kFloat64;
    const int64_t b = 3, t = 257, d = 96;  // odd lengths; more elements than one block's stride
    const auto x = torch::randn({b, t, d}, f32).requires_grad_(true);
    const auto x0 = torch::randn({b, t, d}, f32).requires_grad_(true);
    const auto y = with_y ? torch::randn({b, t, d}, f32).to(ydt).requires_grad_(true) : torch::Tensor();
    const auto lambdas = torch::tensor({1.13, 0.17}, f32).requires_grad_(true);
    const auto up = torch::randn({b, t, d}, f32);
    auto out = ops::residual_mix(x, y, lambdas[0], x0, lambdas[1]);
    ASSERT_NE(out.grad_fn()->name().find("FusedResidualMix"), std::string::npos) << out.grad_fn()->name();
    std::vector<torch::Tensor> inputs = {x, x0, lambdas};
    if (with_y) inputs.push_back(y);
    const auto got = torch::autograd::grad({out}, inputs, {up});
    const auto want_out = with_y ? lambdas[0] * (x + y) + lambdas[1] * x0 : lambdas[0] * x + lambdas[1] * x0;
    const auto want = torch::autograd::grad({want_out}, inputs, {up});
    EXPECT_TRUE(torch::equal(out, want_out)) << ydt;
    EXPECT_TRUE(torch::equal(got[0], want[0])) << "dx " << ydt;
    EXPECT_TRUE(torch::equal(got[1], want[1])) << "dx0 " << ydt;
    if (with_y) {
      EXPECT_EQ(got[3].scalar_type(), ydt);
      EXPECT_TRUE(torch::equal(got[3], want[3])) << "dy " << ydt;
    }
    // The lambdas' gradients: float64 sums of the upstream gradient times x (+ y) and times x0.
    auto f64 = [](const torch::Tensor& v) { return v.detach().cpu().to(torch::kDouble); };
    const auto s = with_y ? f64(x) + f64(y) : f64(x);
    const double dr = (f64(up) * s).sum().item<double>(), db = (f64(up) * f64(x0)).sum().item<double>();
    const auto dl = host(got[2]);
    // FP32 partial sums of ~74k unit-scale products: a few 1e-3 at most; one element left out would move them by ~1.
    const double tol = 1e-4 * std::sqrt(static_cast<double>(b * t * d));
    EXPECT_NEAR(dl[0], dr, tol) << ydt;
    EXPECT_NEAR(dl[1], db, tol) << ydt;
  }
}

// Training's rotation + QK-norm (ops::rotary_norm_train), one kernel each way, against a float64 reference written
// as tensor ops (the rotated halves' cat, the norm's formula) over the same tables: the output and the gradients of x
// and the weight, in BF16 and FP32, without a weight, with an FP32 one and (BF16) with one in x's dtype; positions
// from ids [B, T] that restart within a row, from ids [1, T], or the run from start > 0. dim 96 (48 pairs: not a
// warp's multiple) on tokens that fill no whole CTA (8 tokens, a warp each), dim 16 (fewer pairs than lanes), and
// dim 128 on more tokens than the backward's fixed grid (1024 CTAs) covers in one pass. The rotation alone equals
// model::Rope bit for bit.
TEST(DecodeFusionsCuda, RotaryNormTrainsWithTheTensorOpsGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(21);
  const auto dev = torch::Device(torch::kCUDA);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong).device(dev);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(dev);
  enum class Ids { kNone, kRestarting, kShared };
  struct Case {
    int64_t b, t, heads, dim;
    Ids ids;
    int64_t start;
  };
  for (const Case c : {Case{2, 37, 3, 96, Ids::kRestarting, 0}, Case{3, 5, 2, 16, Ids::kShared, 0},
                       Case{3, 3000, 2, 128, Ids::kNone, 7}, Case{1, 9, 5, 96, Ids::kNone, 300}}) {
    const double eps = 1e-6;
    const int64_t half = c.dim / 2;
    const model::Rope rope(c.dim, 10000.0);
    torch::Tensor ids;  // row 0: documents of 20 and t - 20 tokens; row 1: one of t
    if (c.ids == Ids::kRestarting)
      ids = torch::stack({torch::cat({torch::arange(20, i64), torch::arange(c.t - 20, i64)}), torch::arange(c.t, i64)});
    if (c.ids == Ids::kShared) ids = (torch::arange(c.t, i64) % 3).view({1, c.t});
    const model::RotaryPositions pos{c.start, ids, ids.defined() ? c.t : c.start + c.t};
    for (auto dt : {torch::kBFloat16, torch::kFloat}) {
      const auto [cos, sin] = rope.tables(dev, dt, pos.end);
      // The tables' rows at each token's position, in float64: [B or 1, T, 1, half].
      auto rows = [&](const torch::Tensor& table) {
        const auto t64 = table.to(torch::kDouble);
        return ids.defined() ? t64.index_select(0, ids.reshape({-1})).view({-1, c.t, 1, half})
                             : t64.narrow(0, c.start, c.t).view({1, c.t, 1, half});
      };
      const auto cd = rows(cos), sd = rows(sin);
      for (int wkind : {0, 1, 2}) {  // none, FP32, x's dtype
        if (wkind == 2 && dt == torch::kFloat) continue;
        const std::string what = std::string(c10::toString(dt)) + " dim " + std::to_string(c.dim) + " weight " +
                                 std::to_string(wkind) + " rows " + std::to_string(c.b * c.t * c.heads);
        const auto x = (torch::randn({c.b, c.t, c.heads, c.dim}, f64) * 1.5).to(dt).requires_grad_(true);
        torch::Tensor w;
        if (wkind > 0) w = (torch::rand({c.dim}, f64) + 0.5).to(wkind == 1 ? torch::kFloat : dt).requires_grad_(true);
        ASSERT_TRUE(ops::rotary_norm_train_fusable(x, w)) << what;
        const auto out = ops::rotary_norm_train(x, ids, c.start, cos, sin, w, eps);
        ASSERT_EQ(out.scalar_type(), dt) << what;
        ASSERT_EQ(out.sizes(), x.sizes()) << what;
        ASSERT_TRUE(out.grad_fn()) << what;
        ASSERT_NE(out.grad_fn()->name().find("FusedRotaryNorm"), std::string::npos) << out.grad_fn()->name();
        if (wkind == 0) {
          torch::NoGradGuard no_grad;
          EXPECT_TRUE(torch::equal(out, rope(x, pos))) << what;
        }
        const auto up = torch::randn(x.sizes(), f64).to(dt);
        std::vector<torch::Tensor> inputs = {x};
        if (w.defined()) inputs.push_back(w);
        const auto got = torch::autograd::grad({out}, inputs, {up});

        const auto xd = x.detach().to(torch::kDouble).requires_grad_(true);
        const auto wd = w.defined() ? w.detach().to(torch::kDouble).requires_grad_(true) : torch::Tensor();
        const auto x1 = xd.narrow(3, 0, half), x2 = xd.narrow(3, half, half);
        const auto r = torch::cat({x1 * cd - x2 * sd, x2 * cd + x1 * sd}, 3);
        const auto want = wd.defined() ? r * torch::rsqrt(r.pow(2).mean(-1, true) + eps) * wd : r;
        std::vector<torch::Tensor> wants = {xd};
        if (wd.defined()) wants.push_back(wd);
        const auto want_g = torch::autograd::grad({want}, wants, {up.to(torch::kDouble)});
        // The largest difference relative to the largest value.
        auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
          return (a.detach().to(torch::kDouble) - b).abs().max().item<double>() / b.abs().max().item<double>();
        };
        // BF16: the rotation's products and sum round to BF16 (as model::Rope), then the output rounds again: up to
        // four roundings of 2^-9 (seen: 7e-3 on the output, 4e-3 on the gradients, which round once). FP32: roundings
        // of FP32 sums and products (seen: 2e-7).
        const double tol = dt == torch::kFloat ? 1e-5 : 1e-2, tol_out = dt == torch::kFloat ? 1e-5 : 1.6e-2;
        EXPECT_LT(rel(out, want), tol_out) << what;
        EXPECT_EQ(got[0].scalar_type(), dt) << what;
        EXPECT_LT(rel(got[0], want_g[0]), tol) << "dx " << what;
        if (w.defined()) {
          EXPECT_EQ(got[1].scalar_type(), w.scalar_type()) << what;
          EXPECT_EQ(got[1].sizes(), w.sizes()) << what;
          EXPECT_LT(rel(got[1], want_g[1]), tol) << "dweight " << what;
        }
      }
    }
  }
}

// Through the attention layer under training: with the fused rotation + QK-norm the output and the gradients of the
// projections and norm weights are the tensor ops' (the kernels off) to BF16 roundings, with packed documents too.
TEST(DecodeFusionsCuda, AttentionTrainsAlikeWithTheFusedRotaryNorm) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto j = nlohmann::json::parse(R"({
    "name": "a", "vocab_size": 16, "d_model": 64, "depth": 1, "pattern": "A", "seq_len": 64,
    "attention": {"heads": 4, "kv_heads": 2, "head_dim": 32, "rope_theta": 10000}
  })");
  const Recipe r = parse(j);
  const auto plan = make_plan(r);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  model::Attention attn(r, plan.layers[0], opts);
  torch::manual_seed(5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : attn->parameters()) p.dim() == 2 ? p.normal_(0.0, 0.2) : p.normal_(1.0, 0.1);
  }
  ASSERT_TRUE(attn->q_norm);
  const auto h = torch::randn({2, 40, 64}).to(opts);
  const auto up = torch::randn({2, 40, 64}).to(opts);
  const auto doc_ids =
      torch::cat({torch::zeros({1, 40}, torch::kLong),
                  torch::cat({torch::zeros({13}, torch::kLong), torch::ones({27}, torch::kLong)}).view({1, 40})})
          .cuda();
  const auto docs = model::documents_from_ids(doc_ids);
  ASSERT_TRUE(docs.has_value());
  for (const model::Documents* d : {static_cast<const model::Documents*>(nullptr), &*docs}) {
    std::vector<torch::Tensor> outs, grads;
    for (bool fused : {true, false}) {
      ops::set_fused_kernels(fused);
      const auto out = attn->forward(h, nullptr, d);
      const auto params = attn->parameters();
      auto g = torch::autograd::grad({out}, params, {up});
      outs.push_back(out.to(torch::kFloat));
      for (auto& t : g) grads.push_back(t.to(torch::kFloat));
    }
    ops::set_fused_kernels(true);
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
    };
    EXPECT_LT(rel(outs[0], outs[1]), 2e-2) << (d ? "documents" : "one sequence");
    const size_t n = grads.size() / 2;
    for (size_t i = 0; i < n; ++i)
      EXPECT_LT(rel(grads[i], grads[n + i]), 3e-2) << "parameter " << i << (d ? " documents" : " one sequence");
  }
}

// Each assignment's row against its own expert's matrix, read in place, equals a float64 product; through the MoE
// layer, the decode step's gathered experts equal the per-expert loop and the copying form they replace.
TEST(DecodeFusionsCuda, GatheredLinearEqualsEachAssignmentsMatrix) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    const int64_t experts = 6, out = 40, in = 72, rows = 3, k = 2;
    const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
    const auto w = torch::randn({experts, out, in}).to(o), x = torch::randn({rows, in}).to(o);
    const auto ids = torch::tensor({5L, 0L, 3L, 3L, 1L, 5L}).cuda();
    ASSERT_TRUE(ops::gathered_linear_fusable(x, w));
    const auto y = ops::gathered_linear(x, w, ids, k);
    ASSERT_EQ(y.sizes(), (torch::IntArrayRef{rows * k, out}));
    const auto wd = w.cpu().to(torch::kDouble), xd = x.cpu().to(torch::kDouble), got = y.cpu().to(torch::kDouble);
    const auto idc = ids.cpu();
    for (int64_t a = 0; a < rows * k; ++a) {
      const auto want = wd[idc[a].item<int64_t>()].matmul(xd[a / k]);
      const double scale = want.abs().max().item<double>();
      EXPECT_LT((got[a] - want).abs().max().item<double>() / scale, dt == torch::kFloat ? 1e-6 : 8e-3)
          << dt << " assignment " << a;
    }
  }

  auto j = nlohmann::json::parse(R"({
    "name": "e", "vocab_size": 16, "d_model": 64, "depth": 1, "pattern": "E", "seq_len": 32,
    "moe": {"routed_experts": 16, "experts_per_token": 4, "expert_hidden": 48, "shared_experts": 0}
  })");
  model::MoE m(parse(j), torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16));
  for (auto& p : m->parameters()) p.normal_(0.0, 0.2);
  m->eval();
  const auto u = torch::randn({2, 64}).cuda().to(torch::kBFloat16);
  const auto routing = m->route_tokens(u);
  const auto fused = model::gathered_experts(u, routing, *m->experts).to(torch::kFloat);
  const auto loop = model::loop_experts(u, routing, *m->experts).to(torch::kFloat);
  ops::set_fused_kernels(false);
  const auto copied = model::gathered_experts(u, routing, *m->experts).to(torch::kFloat);
  ops::set_fused_kernels(true);
  const double scale = loop.abs().max().item<double>();
  EXPECT_LT((fused - loop).abs().max().item<double>() / scale, 2e-2);
  EXPECT_LT((fused - copied).abs().max().item<double>() / scale, 2e-2);
  EXPECT_GT(scale, 0.0);
}

namespace {
// An MoE layer on the GPU in eval mode (d_model 64, 16 experts, top-4, random weights) for one decode step's tokens.
model::MoE decode_moe(int64_t shared_experts, int64_t expert_hidden, int64_t shared_hidden, torch::ScalarType dt) {
  auto j = nlohmann::json::parse(R"({
    "name": "e", "vocab_size": 16, "d_model": 64, "depth": 1, "pattern": "E", "seq_len": 32,
    "moe": {"routed_experts": 16, "experts_per_token": 4, "routed_scaling_factor": 2.5}
  })");
  j["moe"]["shared_experts"] = shared_experts;
  j["moe"]["expert_hidden"] = expert_hidden;
  j["moe"]["shared_expert_hidden"] = shared_hidden;
  model::MoE m(parse(j), torch::TensorOptions().device(torch::kCUDA).dtype(dt));
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.2);
  m->eval();
  return m;
}
}  // namespace

// The MoE's down projection in one kernel (SwiGLU of each assignment's hidden row, its expert's w2, the gate-weighted
// sum over the slots, the shared expert) equals the float64 sum written out; through the MoE layer, a decode step's
// tokens get what the tensor ops give (ops::set_fused_kernels(false)), with and without a shared expert.
TEST(DecodeFusionsCuda, SwigluCombineEqualsTheFloat64Experts) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(10);
  const auto silu = [](const torch::Tensor& v) { return v / (1 + torch::exp(-v)); };
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    for (const bool with_shared : {true, false}) {
      const int64_t tokens = 3, k = 3, experts = 7, out = 40, hidden = 24, shared_hidden = 32;
      const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      const auto h = torch::randn({tokens * k, 2 * hidden}).to(o), w = torch::randn({experts, out, hidden}).to(o);
      const auto hs = torch::randn({tokens, 2 * shared_hidden}).to(o), ws = torch::randn({out, shared_hidden}).to(o);
      const auto ids = torch::tensor({6L, 0L, 2L, 2L, 5L, 1L, 0L, 3L, 6L}).cuda();
      const auto gates = torch::rand({tokens, k}).cuda();
      ASSERT_TRUE(ops::gathered_swiglu_combine_fusable(h, w, k, with_shared ? ws : torch::Tensor()));
      const auto y = ops::gathered_swiglu_combine(h, w, ids, gates, with_shared ? hs : torch::Tensor(),
                                                  with_shared ? ws : torch::Tensor());
      ASSERT_EQ(y.sizes(), (torch::IntArrayRef{tokens, out}));
      const auto hd = h.cpu().to(torch::kDouble), wd = w.cpu().to(torch::kDouble), gd = gates.cpu().to(torch::kDouble);
      const auto hsd = hs.cpu().to(torch::kDouble), wsd = ws.cpu().to(torch::kDouble), idc = ids.cpu();
      const auto got = y.cpu().to(torch::kDouble);
      for (int64_t t = 0; t < tokens; ++t) {
        auto want = torch::zeros({out}, torch::kDouble);
        for (int64_t s = 0; s < k; ++s) {
          const auto row = hd[t * k + s];
          const auto act = silu(row.narrow(0, 0, hidden)) * row.narrow(0, hidden, hidden);
          want += gd[t][s] * wd[idc[t * k + s].item<int64_t>()].matmul(act);
        }
        if (with_shared)
          want += wsd.matmul(silu(hsd[t].narrow(0, 0, shared_hidden)) * hsd[t].narrow(0, shared_hidden, shared_hidden));
        const double scale = want.abs().max().item<double>();
        EXPECT_LT((got[t] - want).abs().max().item<double>() / scale, dt == torch::kFloat ? 1e-5 : 8e-3)
            << dt << " shared " << with_shared << " token " << t;
      }
    }
  }
  EXPECT_THROW(ops::gathered_swiglu_combine(torch::randn({4, 48}).cuda(), torch::randn({7, 40, 24}).cuda(),
                                            torch::zeros({4}, torch::kLong).cuda(), torch::rand({2, 3}).cuda(),
                                            torch::Tensor(), torch::Tensor()),
               Error);  // 4 rows of h for 2 tokens x 3 slots

  for (const int64_t shared_experts : {1, 0}) {
    for (auto dt : {torch::kFloat, torch::kBFloat16}) {
      auto m = decode_moe(shared_experts, 48, 40, dt);
      const auto h = torch::randn({1, 2, 64}).cuda().to(dt);  // two tokens, 8 assignments: the decode path
      // The layer takes the combine kernel here (else both sides below would be the tensor ops).
      ASSERT_TRUE(
          ops::gathered_swiglu_combine_fusable(h.view({2, 64}), m->experts->w2.dense(), 4,
                                               shared_experts ? m->shared->w2->weight.dense() : torch::Tensor()));
      const auto fused = m->forward(h).to(torch::kFloat);
      ops::set_fused_kernels(false);
      const auto tensor_ops = m->forward(h).to(torch::kFloat);
      ops::set_fused_kernels(true);
      const double scale = tensor_ops.abs().max().item<double>();
      EXPECT_GT(scale, 0.0);
      EXPECT_LT((fused - tensor_ops).abs().max().item<double>() / scale, dt == torch::kFloat ? 1e-5 : 2e-2)
          << dt << " shared experts " << shared_experts;
    }
  }
}

// The combine with NVFP4 down projections (routed experts and the shared one): equal to float64 sums over the
// dequantized matrices (quant's own decode, tested against its definition in test_nvfp4*) of the activations rounded
// to BF16, the NVFP4 products' input; through the MoE layer with every expert matrix in NVFP4, equal to the unfused
// NVFP4 path.
TEST(DecodeFusionsCuda, SwigluCombineNvfp4EqualsTheFloat64Experts) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(12);
  const auto silu = [](const torch::Tensor& v) { return v / (1 + torch::exp(-v)); };
  const auto bf16 = [](const torch::Tensor& v) { return v.to(torch::kBFloat16).to(torch::kDouble); };
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    for (const bool with_shared : {true, false}) {
      const int64_t tokens = 3, k = 3, experts = 7, out = 40, hidden = 64, shared_hidden = 96;
      const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      const auto h = torch::randn({tokens * k, 2 * hidden}).to(o), hs = torch::randn({tokens, 2 * shared_hidden}).to(o);
      const auto q = nvfp4::quantize(torch::randn({experts, out, hidden}) * torch::exp(torch::randn({experts, 1, 1})));
      const auto qs = nvfp4::quantize(torch::randn({out, shared_hidden}));
      const auto qc = q.to(torch::kCUDA), qsc = qs.to(torch::kCUDA);
      const auto ids = torch::tensor({6L, 0L, 2L, 2L, 5L, 1L, 0L, 3L, 6L}).cuda();
      const auto gates = torch::rand({tokens, k}).cuda();
      const auto w_shared = with_shared ? nvfp4::as_stack(qsc) : ops::Nvfp4Stack{};
      ASSERT_TRUE(ops::gathered_swiglu_combine_nvfp4_fusable(h, nvfp4::as_stack(qc), k, w_shared));
      const auto y = ops::gathered_swiglu_combine_nvfp4(h, nvfp4::as_stack(qc), ids, gates,
                                                        with_shared ? hs : torch::Tensor(), w_shared);
      ASSERT_EQ(y.sizes(), (torch::IntArrayRef{tokens, out}));
      const auto hd = h.cpu().to(torch::kDouble), gd = gates.cpu().to(torch::kDouble),
                 hsd = hs.cpu().to(torch::kDouble);
      const auto wd = nvfp4::dequantize(q, torch::kDouble), wsd = nvfp4::dequantize(qs, torch::kDouble);
      const auto idc = ids.cpu(), got = y.cpu().to(torch::kDouble);
      for (int64_t t = 0; t < tokens; ++t) {
        auto want = torch::zeros({out}, torch::kDouble);
        for (int64_t s = 0; s < k; ++s) {
          const auto row = hd[t * k + s];
          want += gd[t][s] * wd[idc[t * k + s].item<int64_t>()].matmul(
                                 bf16(silu(row.narrow(0, 0, hidden)) * row.narrow(0, hidden, hidden)));
        }
        if (with_shared)
          want += wsd.matmul(
              bf16(silu(hsd[t].narrow(0, 0, shared_hidden)) * hsd[t].narrow(0, shared_hidden, shared_hidden)));
        const double scale = want.abs().max().item<double>();
        // FP32: the activations' BF16 rounding in float64 here and from FP32 in the kernel can differ by one step
        // where the two land on either side of a tie.
        EXPECT_LT((got[t] - want).abs().max().item<double>() / scale, dt == torch::kFloat ? 2e-3 : 8e-3)
            << dt << " shared " << with_shared << " token " << t;
      }
    }
  }

  for (const int64_t shared_experts : {1, 0}) {
    auto m = decode_moe(shared_experts, 64, 96, torch::kBFloat16);
    m->experts->w13.use_nvfp4(nvfp4::quantize(m->experts->w13.dense().cpu().to(torch::kFloat)), "w13");
    m->experts->w2.use_nvfp4(nvfp4::quantize(m->experts->w2.dense().cpu().to(torch::kFloat)), "w2");
    if (shared_experts) {
      m->shared->w13->weight.use_nvfp4(nvfp4::quantize(m->shared->w13->weight.dense().cpu().to(torch::kFloat)), "s13");
      m->shared->w2->weight.use_nvfp4(nvfp4::quantize(m->shared->w2->weight.dense().cpu().to(torch::kFloat)), "s2");
    }
    const auto h = torch::randn({1, 2, 64}).cuda().to(torch::kBFloat16);  // two tokens, 8 assignments
    ASSERT_TRUE(ops::gathered_swiglu_combine_nvfp4_fusable(
        h, nvfp4::as_stack(m->experts->w2.nvfp4()), 4,
        shared_experts ? nvfp4::as_stack(m->shared->w2->weight.nvfp4()) : ops::Nvfp4Stack{}));
    const auto fused = m->forward(h).to(torch::kFloat);
    ops::set_fused_kernels(false);
    const auto unfused = m->forward(h).to(torch::kFloat);
    ops::set_fused_kernels(true);
    const double scale = unfused.abs().max().item<double>();
    EXPECT_GT(scale, 0.0);
    EXPECT_LT((fused - unfused).abs().max().item<double>() / scale, 2e-2) << "shared experts " << shared_experts;
  }
}

// A decode step's dense projections (one row) take the same kernel with one matrix: equal to at::linear to a rounding
// of the dtype, and to a float64 product; with FP32 output (the router's logits) equal to the float64 product to FP32's
// rounding.
TEST(DecodeFusionsCuda, SmallBatchLinearEqualsTheFloat64Product) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(8);
  for (auto dt : {torch::kFloat, torch::kBFloat16}) {
    for (int64_t rows : {1, 2, 3}) {
      const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      const auto w = torch::randn({300, 256}).to(o), x = torch::randn({rows, 1, 256}).to(o);
      const auto y = ops::small_batch_linear(x, w);
      ASSERT_EQ(y.sizes(), (torch::IntArrayRef{rows, 1, 300}));
      const auto want = x.cpu().to(torch::kDouble).matmul(w.cpu().to(torch::kDouble).t());
      const double scale = want.abs().max().item<double>();
      EXPECT_LT((y.cpu().to(torch::kDouble) - want).abs().max().item<double>() / scale,
                dt == torch::kFloat ? 1e-6 : 8e-3)
          << dt << " rows " << rows;
      // Beyond kGemvMaxRows the product is at::linear itself.
      if (rows <= ops::kGemvMaxRows) {
        EXPECT_LT((y - at::linear(x, w)).abs().max().item<double>() / scale, dt == torch::kFloat ? 1e-5 : 8e-3);
      }
      // FP32 out from the inputs as they are: BF16 products are exact in FP32, so only the sum's order differs.
      const auto yf = ops::small_batch_linear_float(x, w);
      ASSERT_EQ(yf.scalar_type(), torch::kFloat);
      EXPECT_LT((yf.cpu().to(torch::kDouble) - want).abs().max().item<double>() / scale, 1e-6)
          << dt << " rows " << rows;
    }
  }
}
