// MoE: sorted dropless dispatch against the dense masked reference, the grouped-GEMM path against the
// per-expert loop and the float64 reference (CPU, and CUDA when present), what the balancing bias may and may
// not change, the aux-loss-free balancing loop, router statistics and the sequence-wise aux loss.
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAFunctions.h>  // the sync debug mode; in the CUDA-enabled libtorch both builds link

#include <algorithm>

#include "model_test_util.h"
#include "quant/nvfp4_fp32_kernel.h"
#include "slm/model/layers/moe.h"

using namespace slm;
using namespace slm::test;

namespace {

Recipe moe_recipe(double aux_weight = 0.0) {
  auto j = nlohmann::json::parse(R"({
    "name": "e", "vocab_size": 16, "d_model": 16, "depth": 1, "pattern": "E", "seq_len": 32,
    "moe": {"routed_experts": 8, "experts_per_token": 3, "expert_hidden": 12, "shared_experts": 2,
            "shared_expert_hidden": 5, "routed_scaling_factor": 2.5, "bias_update_rate": 0.01}
  })");
  j["moe"]["aux_loss_weight"] = aux_weight;
  return parse(j);
}

model::MoE random_moe(double aux_weight = 0.0, torch::ScalarType dtype = torch::kFloat, uint64_t seed = 4) {
  model::MoE m(moe_recipe(aux_weight), torch::TensorOptions().dtype(dtype));
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.3);
  return m;
}

// The experts aligned_moe starves: first, middle and last of the sorted order.
const std::vector<int64_t> kStarved = {0, 3, 7};

// Sizes the grouped GEMM takes on the GPU too (multiples of 8 bf16 elements): D 32, hidden 16, 8 experts, top-3.
model::MoE aligned_moe(const torch::TensorOptions& options = {}) {
  auto j = nlohmann::json::parse(R"({
    "name": "e", "vocab_size": 16, "d_model": 32, "depth": 1, "pattern": "E", "seq_len": 32,
    "moe": {"routed_experts": 8, "experts_per_token": 3, "expert_hidden": 16, "shared_experts": 1,
            "shared_expert_hidden": 16, "routed_scaling_factor": 2.5, "bias_update_rate": 0.01}
  })");
  model::MoE m(parse(j), options);
  torch::manual_seed(9);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.3);
  // A bias far below the affinities' [0, 1] range: these experts never win a top-3 slot.
  for (int64_t e : kStarved) m->expert_bias[e] = -10.0;
  return m;
}

using ExpertPath = torch::Tensor (*)(const torch::Tensor&, const model::Routing&, const model::ExpertsImpl&);

// A path's routed output for u and the gradients of <output, up> for the input, w13, w2 and the router weight.
std::vector<torch::Tensor> output_and_grads(model::MoEImpl& m, const torch::Tensor& u, const torch::Tensor& up,
                                            ExpertPath path) {
  auto x = u.detach().requires_grad_();
  auto y = path(x, m.route_tokens(x), *m.experts);
  auto g = torch::autograd::grad({(y.to(up.scalar_type()) * up).sum()},
                                 {x, m.experts->w13.dense(), m.experts->w2.dense(), m.router->weight.dense()});
  return {y, g[0], g[1], g[2], g[3]};
}

// max |a - ref| relative to max |ref|, on the CPU in float64.
double rel_diff(const torch::Tensor& a, const torch::Tensor& ref) {
  return max_abs_diff(a.cpu(), ref.cpu()) / ref.abs().max().cpu().item<double>();
}

// BF16 CUDA autocast for one scope, as the trainer runs the forward.
struct CudaAutocastBf16 {
  CudaAutocastBf16() {
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  ~CudaAutocastBf16() {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
};

}  // namespace

TEST(MoE, SortedDispatchMatchesDenseReference) {
  single_threaded();
  auto m = random_moe();
  torch::manual_seed(5);
  auto u = torch::randn({37, 16});
  auto routing = m->route_tokens(u);
  EXPECT_STREQ(m->experts_backend(u).name(), "moe.loop");
  EXPECT_LT(max_abs_diff(m->experts_backend(u).run(u, routing),
                         model::dense_experts_reference(u, routing, *m->experts) + m->shared(u)),
            1e-5);
  auto h = torch::randn({3, 9, 16});
  EXPECT_LT(max_abs_diff(m->forward(h), m->forward_reference(h)), 1e-5);
}

TEST(MoE, DispatchGradientsMatchDenseReference) {
  single_threaded();
  auto m = random_moe();
  auto u = torch::randn({20, 16}, torch::requires_grad());
  auto w13 = m->experts->w13.dense(), w2 = m->experts->w2.dense();
  const auto& ex = *m->experts;
  auto g1 = torch::autograd::grad({model::loop_experts(u, m->route_tokens(u), ex).pow(2).sum()}, {u, w13, w2});
  auto g2 =
      torch::autograd::grad({model::dense_experts_reference(u, m->route_tokens(u), ex).pow(2).sum()}, {u, w13, w2});
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_LT(max_abs_diff(g1[i], g2[i]), 1e-4) << i;
}

TEST(MoE, GateWeightsAreNormalizedSelectedAffinitiesTimesScale) {
  single_threaded();
  torch::manual_seed(6);
  auto logits = torch::randn({10, 8});
  auto r = model::route(logits, torch::zeros({8}), 3, 2.5);
  auto s = torch::sigmoid(logits);
  auto expected_experts = std::get<1>(s.topk(3, -1));
  EXPECT_TRUE(torch::equal(std::get<0>(r.experts.sort(-1)), std::get<0>(expected_experts.sort(-1))));
  auto sel = s.gather(1, r.experts);
  EXPECT_LT(max_abs_diff(r.weights, sel / sel.sum(-1, true) * 2.5), 1e-6);
  EXPECT_LT(max_abs_diff(r.weights.sum(-1), torch::full({10}, 2.5)), 1e-5);
}

TEST(MoE, BiasChangesSelectionButNotWeights) {
  single_threaded();
  torch::manual_seed(7);
  auto logits = torch::randn({64, 8});
  auto s = torch::sigmoid(logits);
  auto bias = torch::zeros({8});
  bias[5] = 10.0f;  // expert 5 wins every token's selection
  auto r = model::route(logits, bias, 2, 1.0);
  EXPECT_TRUE((r.experts == 5).any(1).all().item<bool>());
  // Weights still come from the unbiased affinities of whatever was selected.
  auto sel = s.gather(1, r.experts);
  EXPECT_LT(max_abs_diff(r.weights, sel / sel.sum(-1, true)), 1e-6);
  EXPECT_LT(max_abs_diff(r.scores, s), 1e-7);
  // Expert 5 is rarely in the unbiased top 2, so the bias really changed selections.
  auto unbiased = model::route(logits, torch::zeros({8}), 2, 1.0);
  EXPECT_LT((unbiased.experts == 5).any(1).sum().item<int64_t>(), 40);
}

TEST(MoE, BalancingBiasReducesMaxViolationOnSkewedRouter) {
  single_threaded();
  const int64_t experts = 8, tokens = 512, k = 2;
  torch::manual_seed(8);
  // Expert e gets a logit offset growing with e: the last experts take most tokens.
  auto skew = torch::linspace(-1.5, 1.5, experts);
  auto bias = torch::zeros({experts});
  auto violation = [&](const torch::Tensor& logits) {
    return model::max_violation(model::expert_load(model::route(logits, bias, k, 1.0).experts, experts));
  };
  auto probe = torch::randn({tokens, experts}) + skew;
  const double before = violation(probe);
  double late = 0;
  for (int step = 0; step < 200; ++step) {
    auto logits = torch::randn({tokens, experts}) + skew;  // a fresh batch each step
    auto load = model::expert_load(model::route(logits, bias, k, 1.0).experts, experts);
    if (step >= 180) late += model::max_violation(load) / 20.0;
    model::update_balancing_bias(bias, load, 0.01);
  }
  EXPECT_GT(before, 1.0);
  EXPECT_LT(late, before / 4) << "before " << before << " after " << late;
  EXPECT_LT(violation(probe), before / 4);
  // The overloaded experts were pushed down, the starved ones up.
  EXPECT_LT(bias[experts - 1].item<float>(), 0.0f);
  EXPECT_GT(bias[0].item<float>(), 0.0f);
}

TEST(MoE, RouterStatsPendingLoadAndBiasUpdate) {
  single_threaded();
  auto m = random_moe();
  m->train();
  auto h = torch::randn({2, 10, 16});
  m->forward(h);
  auto stats = m->last_stats();
  ASSERT_EQ(stats.load.size(), 8u);
  int64_t sum = 0, mx = 0;
  for (auto l : stats.load) sum += l, mx = std::max(mx, l);
  EXPECT_EQ(sum, 2 * 10 * 3);
  EXPECT_NEAR(stats.max_violation, (mx - 60.0 / 8) / (60.0 / 8), 1e-9);
  m->forward(h);
  EXPECT_EQ(m->pending_load().sum().item<int64_t>(), 2 * 60);
  auto pending = m->pending_load().clone().to(torch::kFloat);
  m->update_bias();
  auto expected = torch::sign(pending.mean() - pending) * 0.01;
  EXPECT_LT(max_abs_diff(m->expert_bias, expected), 1e-7);
  EXPECT_EQ(m->pending_load().sum().item<int64_t>(), 0);
  // Evaluation forwards do not count toward balancing.
  m->eval();
  m->forward(h);
  EXPECT_EQ(m->pending_load().sum().item<int64_t>(), 0);
}

TEST(MoE, SequenceAuxLossFollowsTheFormulaAndIsOffByDefault) {
  single_threaded();
  auto off = random_moe(0.0);
  off->train();
  auto h = torch::randn({2, 6, 16});
  off->forward(h);
  EXPECT_FALSE(off->aux_loss().defined());

  auto on = random_moe(0.1);
  on->train();
  on->forward(h);
  ASSERT_TRUE(on->aux_loss().defined());
  auto u = h.reshape({12, 16});
  auto r = on->route_tokens(u);
  double expected = 0;
  for (int64_t b = 0; b < 2; ++b) {
    auto s = r.scores.narrow(0, b * 6, 6);
    auto e = r.experts.narrow(0, b * 6, 6);
    auto p = (s / s.sum(-1, true)).mean(0);
    for (int64_t i = 0; i < 8; ++i) {
      double f = 8.0 / (3 * 6) * (e == i).sum().item<double>();
      expected += f * p[i].item<double>() / 2;
    }
  }
  EXPECT_NEAR(on->aux_loss().item<double>(), 0.1 * expected, 1e-6);
  auto g = torch::autograd::grad({on->aux_loss()}, {on->router->weight.dense()});
  EXPECT_GT(g[0].abs().sum().item<double>(), 0.0);
}

TEST(MoE, GroupedExpertsMatchTheLoopInBf16) {
  single_threaded();
  auto m = aligned_moe(torch::TensorOptions().dtype(torch::kBFloat16));
  torch::manual_seed(10);
  auto u = torch::randn({50, 32}).to(torch::kBFloat16);
  auto up = torch::randn({50, 32});
  auto load = model::expert_load(m->route_tokens(u).experts, 8);
  for (int64_t e = 0; e < 8; ++e) {
    const bool starved = std::count(kStarved.begin(), kStarved.end(), e) > 0;
    EXPECT_EQ(load[e].item<int64_t>() == 0, starved) << e;
  }
  auto grouped = output_and_grads(*m, u, up, model::grouped_experts);
  auto loop = output_and_grads(*m, u, up, model::loop_experts);
  // Both round every product to bf16 (8 significant bits, ulp 2^-8 relative); the tolerance allows a few ulps of
  // the largest value for different summation orders.
  const char* names[] = {"output", "input", "w13", "w2", "router"};
  for (size_t i = 0; i < grouped.size(); ++i) EXPECT_LT(rel_diff(grouped[i], loop[i]), 1e-2) << names[i];
  for (int64_t e : kStarved) {
    EXPECT_EQ(grouped[2][e].abs().max().item<float>(), 0.0f) << e;
    EXPECT_EQ(grouped[3][e].abs().max().item<float>(), 0.0f) << e;
  }
}

TEST(MoE, GroupedExpertsMatchFloat64DenseReference) {
  single_threaded();
  auto m = aligned_moe();  // fp32 master weights: grouped_experts casts them to bf16
  torch::manual_seed(11);
  auto u = torch::randn({48, 32}).to(torch::kBFloat16).to(torch::kFloat);  // exact in bf16
  auto up = torch::randn({48, 32}, torch::kDouble);
  model::Routing r = m->route_tokens(u);
  r.weights = r.weights.detach();  // the router's gradient is compared with the loop's above
  auto x = u.clone().requires_grad_();
  auto y = model::grouped_experts(x, r, *m->experts);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  auto g =
      torch::autograd::grad({(y.to(torch::kDouble) * up).sum()}, {x, m->experts->w13.dense(), m->experts->w2.dense()});
  EXPECT_EQ(g[1].scalar_type(), torch::kFloat);

  // The reference: every expert on every token in float64, from the same bf16-rounded weights.
  model::Experts ref(8, 32, 16, torch::TensorOptions().dtype(torch::kDouble));
  {
    torch::NoGradGuard no_grad;
    ref->w13.dense().copy_(m->experts->w13.dense().to(torch::kBFloat16));
    ref->w2.dense().copy_(m->experts->w2.dense().to(torch::kBFloat16));
  }
  auto x64 = u.to(torch::kDouble).requires_grad_();
  auto y64 = model::dense_experts_reference(x64, r, *ref);
  auto g64 = torch::autograd::grad({(y64 * up).sum()}, {x64, ref->w13.dense(), ref->w2.dense()});
  // bf16 rounds the hidden activations, the gated outputs and their sum (2^-9 relative each, compounding
  // through SwiGLU and the second GEMM), and the gradients likewise on the way back: about 1e-2 of the largest
  // value at worst over 20 random draws of this setup, so 2e-2.
  EXPECT_LT(rel_diff(y, y64), 2e-2);
  const char* names[] = {"input", "w13", "w2"};
  for (size_t i = 0; i < g.size(); ++i) EXPECT_LT(rel_diff(g[i], g64[i]), 2e-2) << names[i];
}

TEST(MoE, CudaGroupedDispatchMatchesTheLoopUnderAutocast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto m = aligned_moe(torch::TensorOptions().device(torch::kCUDA));  // fp32 master weights, as in training
  torch::manual_seed(12);
  auto u = torch::randn({256, 32}).cuda();
  auto up = torch::randn({256, 32}).cuda();
  CudaAutocastBf16 autocast;
  auto grouped = output_and_grads(*m, u, up, model::grouped_experts);
  auto loop = output_and_grads(*m, u, up, model::loop_experts);  // at::linear, cast to bf16 by autocast
  EXPECT_EQ(loop[0].scalar_type(), torch::kBFloat16);
  const char* names[] = {"output", "input", "w13", "w2", "router"};
  for (size_t i = 0; i < grouped.size(); ++i) EXPECT_LT(rel_diff(grouped[i], loop[i]), 1e-2) << names[i];
  for (int64_t e : kStarved) EXPECT_EQ(grouped[2][e].abs().max().item<float>(), 0.0f) << e;
}

// A training forward and backward of the whole layer on the grouped path reads nothing back to the host: with the
// sync debug mode at "error", the loop path's count read (or a bincount) would throw. Compiled in every build, run
// where there is a GPU and the CUDA kernels (an SLM_CUDA=OFF build routes with ATen ops, which may read back).
TEST(MoE, CudaGroupedTrainingStepReadsNothingBackToTheHost) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!nvfp4::cuda_kernels_built()) GTEST_SKIP() << "built without SLM_CUDA";
  auto m = aligned_moe(torch::TensorOptions().device(torch::kCUDA));
  torch::manual_seed(12);
  CudaAutocastBf16 autocast;
  m->train();
  auto h = torch::randn({4, 64, 32}).cuda();
  m->forward(h).to(torch::kFloat).sum().backward();  // first use: library handles and workspaces are set up here
  torch::cuda::synchronize();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  EXPECT_NO_THROW(m->forward(h).to(torch::kFloat).sum().backward());
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
}

TEST(MoE, GatheredExpertsEqualTheLoopInFloat64) {
  single_threaded();
  auto m = random_moe(0.0, torch::kDouble, 13);
  // One token is a decode step; several tokens share experts (the loop then runs an expert on two rows).
  for (int64_t n : {1, 2, 5, 16}) {
    auto u = torch::randn({n, 16}, torch::kDouble);
    auto up = torch::randn({n, 16}, torch::kDouble);
    auto gathered = output_and_grads(*m, u, up, model::gathered_experts);
    auto loop = output_and_grads(*m, u, up, model::loop_experts);
    const char* names[] = {"output", "input", "w13", "w2", "router"};
    for (size_t i = 0; i < gathered.size(); ++i) EXPECT_LT(rel_diff(gathered[i], loop[i]), 1e-12) << names[i] << n;
    auto routing = m->route_tokens(u);
    EXPECT_LT(rel_diff(model::gathered_experts(u, routing, *m->experts),
                       model::dense_experts_reference(u, routing, *m->experts)),
              1e-12)
        << n;
  }
}

// On the GPU a decode step's NVFP4 experts gather their matrices by id on the device: the per-expert loop's output
// (the same NVFP4 kernel per expert) and, up to BF16 activations, the dense reference on the dequantized weights.
TEST(MoE, CudaNvfp4ExpertsGatheredByIdEqualTheLoop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!nvfp4::cuda_kernels_built()) GTEST_SKIP() << "built without SLM_CUDA";
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  auto m = aligned_moe(cuda);
  auto q13 = nvfp4::quantize(m->experts->w13.dense().detach().cpu()),
       q2 = nvfp4::quantize(m->experts->w2.dense().detach().cpu());
  model::Experts dequantized(8, 32, 16, cuda);
  {
    torch::NoGradGuard no_grad;
    dequantized->w13.dense().copy_(nvfp4::dequantize(q13, torch::kFloat));
    dequantized->w2.dense().copy_(nvfp4::dequantize(q2, torch::kFloat));
  }
  m->experts->w13.use_nvfp4(q13, "w13");
  m->experts->w2.use_nvfp4(q2, "w2");
  torch::NoGradGuard no_grad;
  torch::manual_seed(15);
  for (int64_t n : {1, 3, 40}) {
    auto u = torch::randn({n, 32}, cuda);
    auto routing = m->route_tokens(u);
    auto gathered = model::nvfp4_gathered_experts(u, routing, *m->experts);
    auto loop = model::loop_experts(u, routing, *m->experts);
    auto ref = model::dense_experts_reference(u, routing, *dequantized);
    EXPECT_LT(max_abs_diff(gathered.cpu(), loop.cpu()) / loop.abs().max().item<double>(), 1e-5) << n;
    EXPECT_LT(max_abs_diff(gathered.cpu(), ref.cpu()) / ref.abs().max().item<double>(), 2e-2) << n;
  }
}

TEST(MoE, Nvfp4ExpertsAreNeverGathered) {
  single_threaded();
  Fp32Nvfp4Kernel exact;  // the comparison below is to FP32 summation order
  auto m = random_moe();
  torch::manual_seed(14);
  auto u = torch::randn({1, 16});
  auto routing = m->route_tokens(u);
  // bmm cannot read NVFP4 codes: a decode step keeps the per-expert loop (nvfp4::linear), which computes with the
  // dequantized weights.
  auto q13 = nvfp4::quantize(m->experts->w13.dense().detach()), q2 = nvfp4::quantize(m->experts->w2.dense().detach());
  model::Experts dequantized(8, 16, 12, torch::TensorOptions());
  {
    torch::NoGradGuard no_grad;
    dequantized->w13.dense().copy_(nvfp4::dequantize(q13, torch::kFloat));
    dequantized->w2.dense().copy_(nvfp4::dequantize(q2, torch::kFloat));
  }
  m->experts->w13.use_nvfp4(q13, "w13");
  m->experts->w2.use_nvfp4(q2, "w2");
  EXPECT_THROW(model::gathered_experts(u, routing, *m->experts), Error);
  torch::NoGradGuard no_grad;
  EXPECT_STREQ(m->experts_backend(u).name(), "moe.loop");
  EXPECT_LT(max_abs_diff(m->experts_backend(u).run(u, routing),
                         model::dense_experts_reference(u, routing, *dequantized) + m->shared(u)),
            1e-5);
}

namespace {
// One rank holding every expert: the exchanges send each row to itself.
class OneRank final : public model::ExpertGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  torch::Tensor exchange(const torch::Tensor& x, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    return x.clone();
  }
};

std::string plan_names(const model::ExpertsPlan& p) {
  return std::string(p.few->name()) + " <=" + std::to_string(p.few_assignments) + " / " + p.many->name();
}
}  // namespace

// The table, row by row, as the issue lists the backends (the facts are given, so the GPU rows are read on the CPU
// too; the backends are built, not run).
TEST(MoE, OneTablePicksTheBackendsFromTheFacts) {
  auto m = aligned_moe();
  auto& e = *m->experts;
  auto plan = [&](model::ExpertsFacts f) { return plan_names(model::plan_experts(f, e, m->shared, 8)); };
  using F = model::ExpertsFacts;
  EXPECT_EQ(plan(F{}), "moe.loop <=0 / moe.loop");
  EXPECT_EQ(plan(F{true, torch::kBFloat16}), "moe.gathered_decode <=8 / moe.grouped");
  EXPECT_EQ(plan(F{true, torch::kFloat, 0, /*bf16_autocast=*/true}), "moe.gathered_decode <=8 / moe.grouped");
  EXPECT_EQ(plan(F{true, torch::kFloat}), "moe.gathered_decode <=8 / moe.loop");
  EXPECT_EQ(plan(F{true, torch::kDouble, 0, true}), "moe.gathered_decode <=8 / moe.loop");
  OneRank group;
  EXPECT_EQ(plan(F{true, torch::kBFloat16, 0, true, &group}), "moe.expert_parallel <=0 / moe.expert_parallel");
  // Sizes _grouped_mm cannot take (hidden 12): the loop.
  auto odd = random_moe();
  EXPECT_EQ(plan_names(model::plan_experts(F{true, torch::kBFloat16}, *odd->experts, odd->shared, 8)),
            "moe.gathered_decode <=8 / moe.loop");
  EXPECT_THROW(model::make_experts_backend(model::ExpertsBackendKind::Nvfp4Gathered, e, m->shared), Error);
  e.w13.use_nvfp4(nvfp4::quantize(e.w13.dense().detach()), "w13");
  EXPECT_EQ(plan(F{true, torch::kFloat, 1}), "moe.loop <=0 / moe.loop");
  e.w2.use_nvfp4(nvfp4::quantize(e.w2.dense().detach()), "w2");
  EXPECT_EQ(plan(F{true, torch::kFloat, 2}), "moe.nvfp4_gathered <=128 / moe.loop");
  EXPECT_EQ(plan(F{false, torch::kFloat, 2}), "moe.loop <=0 / moe.loop");
  EXPECT_THROW(model::make_experts_backend(model::ExpertsBackendKind::Grouped, e, m->shared), Error);
}

// The layer picks from its own facts and picks again when they change: the CPU loops, a spread layer runs
// expert-parallel; the few-row backend takes calls of up to few_assignments assignments (k = 3 here).
TEST(MoE, TheLayerPicksAgainWhenItsFactsChange) {
  auto m = aligned_moe();
  EXPECT_EQ(m->backend_names(), "moe.loop");
  m->spread_experts(std::make_shared<OneRank>());
  EXPECT_EQ(m->backend_names(), "moe.expert_parallel");
  model::ExpertsPlan p = model::plan_experts(model::ExpertsFacts{true, torch::kBFloat16}, *m->experts, m->shared, 8);
  EXPECT_STREQ(p.for_call(torch::zeros({2, 32}), 3).name(), "moe.gathered_decode");  // 6 assignments
  EXPECT_STREQ(p.for_call(torch::zeros({3, 32}), 3).name(), "moe.grouped");          // 9
}

// A layer without shared experts (its SwiGLU holder empty) builds and runs every backend: the routed output alone.
TEST(MoE, BackendsOfALayerWithoutSharedExperts) {
  auto j = nlohmann::json::parse(R"({
    "name": "e", "vocab_size": 16, "d_model": 32, "depth": 1, "pattern": "E", "seq_len": 32,
    "moe": {"routed_experts": 8, "experts_per_token": 2, "expert_hidden": 16, "shared_experts": 0}
  })");
  model::MoE m(parse(j), torch::TensorOptions().dtype(torch::kDouble));
  ASSERT_TRUE(m->shared.is_empty());
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.normal_(0.0, 0.3);
  auto u = torch::randn({3, 32}, torch::kDouble);
  auto routing = m->route_tokens(u);
  auto ref = model::dense_experts_reference(u, routing, *m->experts);
  OneRank group;
  using K = model::ExpertsBackendKind;
  for (auto kind : {K::Loop, K::GatheredDecode, K::ExpertParallel, K::Grouped}) {
    auto b = model::make_experts_backend(kind, *m->experts, m->shared, &group, 8);
    EXPECT_LT(rel_diff(b->run(u, routing).to(torch::kDouble), ref), kind == K::Grouped ? 2e-2 : 1e-12) << b->name();
  }
  EXPECT_EQ(m->forward(u.view({1, 3, 32})).size(2), 32);
}

// Each backend that runs on the CPU computes the routed and shared experts of the dense reference: the loop, the
// gathered decode (bmm on the CPU) and expert-parallel over one rank exactly in FP64, the grouped GEMMs to BF16.
TEST(MoE, EveryBackendComputesTheDenseReference) {
  single_threaded();
  auto m = aligned_moe(torch::TensorOptions().dtype(torch::kDouble));  // sizes _grouped_mm takes
  OneRank group;
  torch::NoGradGuard no_grad;
  for (int64_t n : {1, 2, 19}) {
    auto u = torch::randn({n, 32}, torch::kDouble);
    auto routing = m->route_tokens(u);
    auto ref = model::dense_experts_reference(u, routing, *m->experts) + m->shared(u);
    using K = model::ExpertsBackendKind;
    for (auto [kind, tol] : std::vector<std::pair<K, double>>{
             {K::Loop, 1e-12}, {K::GatheredDecode, 1e-12}, {K::ExpertParallel, 1e-12}, {K::Grouped, 2e-2}}) {
      auto b = model::make_experts_backend(kind, *m->experts, m->shared, &group, 8);
      EXPECT_LT(rel_diff(b->run(u, routing).to(torch::kDouble), ref), tol) << b->name() << " " << n;
    }
  }
}

namespace {
std::vector<std::string>* g_recorded = nullptr;
std::unique_ptr<at::ObserverContext> record_name(const at::RecordFunction& fn) {
  if (g_recorded) g_recorded->push_back(fn.name());
  return nullptr;
}
}  // namespace

// The profiler sees the backend by name: a RecordFunction observer (what torch's profiler registers) records the
// scopes of a forward.
TEST(MoE, TheProfilerSeesTheBackendByName) {
  auto m = aligned_moe();
  std::vector<std::string> names;
  g_recorded = &names;
  auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(record_name));
  {
    torch::NoGradGuard no_grad;
    m->forward(torch::randn({1, 5, 32}));
  }
  at::removeCallback(handle);
  g_recorded = nullptr;
  EXPECT_NE(std::find(names.begin(), names.end(), "moe.loop"), names.end());
}
