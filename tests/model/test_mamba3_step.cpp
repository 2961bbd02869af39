// The fused Mamba-3 decode step (ops::mamba3_step_fused, taken by Mamba3Impl::forward for one token on the GPU and,
// in FP32, on the CPU)
// against the same layer in float64 on the CPU, which runs the libtorch step (mamba3_preprocess + mamba3_step, itself
// tested against the sequential recurrence): the layer output and all four state tensors, from a random mid-sequence
// state, for the head shapes of tiny-hybrid, hybrid-250m and the cmake specialist (8 groups), FP32 and BF16, at batch
// 3 and 40 (on the GPU: several CTAs per head, and one CTA per head for all its rows). The state updated in place
// gives the same bits as in new tensors. The CUDA test is skipped without a GPU and runs on the GPU machine's full
// ctest; the CPU one runs everywhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numbers>
#include <utility>
#include <vector>

#include "model/model_test_util.h"
#include "slm/model/layers/mamba3.h"

using namespace slm;
using namespace slm::test;

namespace {

double rel(const torch::Tensor& a, const torch::Tensor& ref) {
  return (a.cpu().to(torch::kDouble) - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

}  // namespace

namespace {

std::vector<std::pair<torch::ScalarType, int64_t>> batches_of(const std::vector<torch::ScalarType>& dtypes) {
  std::vector<std::pair<torch::ScalarType, int64_t>> v;
  for (const auto dtype : dtypes)
    for (const int64_t b : {3, 40}) v.emplace_back(dtype, b);
  return v;
}

void expect_fused_step_matches(const torch::Device& device, const std::vector<torch::ScalarType>& dtypes) {
  for (const char* path : {"recipes/tiny-hybrid.json", "recipes/hybrid-250m.json", "recipes/specialists/cmake.json"}) {
    Recipe r = load_recipe(source_path(path));
    for (const auto& [dtype, b] : batches_of(dtypes)) {
      torch::manual_seed(5);
      model::Mamba3 ref(r, torch::TensorOptions().dtype(torch::kDouble));
      model::Mamba3 dev(r, torch::TensorOptions().dtype(dtype).device(device));
      torch::NoGradGuard no_grad;
      {
        auto src = ref->named_parameters();
        for (auto& p : src) {
          auto& t = p.value();
          if (t.dim() >= 2)
            t.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(t.size(-1))));
          else
            t.normal_(0.5, 0.3);
          t.copy_(t.to(dtype).to(torch::kDouble));  // what the tested layer holds
        }
        auto dst = dev->named_parameters();
        for (auto& p : src) dst[p.key()].copy_(p.value());
      }
      auto x = torch::randn({b, 1, r.d_model}, torch::kDouble).to(dtype).to(torch::kDouble);
      auto zero = ref->zero_state(b);
      ops::Mamba3State state{torch::rand_like(zero.angle) * 2 * std::numbers::pi, torch::randn_like(zero.ssm),
                             torch::randn_like(zero.k), torch::randn_like(zero.x)};
      auto [y_ref, next_ref] = ref(x, state);
      ops::Mamba3State on_dev{state.angle.to(device, torch::kFloat), state.ssm.to(device, torch::kFloat),
                              state.k.to(device, torch::kFloat), state.x.to(device, torch::kFloat)};
      auto proj = dev->in_proj(x.to(device, dtype)).view({b, -1});
      ASSERT_TRUE(ops::mamba3_step_fusable(proj, dev->weights(), on_dev)) << path;
      auto [y, next] = dev(x.to(device, dtype), on_dev);
      // BF16: the projections the kernel reads and the output are rounded to 8 bits of mantissa.
      const double tol = dtype == torch::kFloat ? 1e-4 : 3e-2;
      EXPECT_LE(rel(y, y_ref), tol) << path << " " << dtype << " batch " << b;
      EXPECT_LE(rel(next.ssm, next_ref.ssm), tol) << path << " " << dtype << " batch " << b;
      EXPECT_LE(rel(next.k, next_ref.k), tol) << path << " " << dtype << " batch " << b;
      EXPECT_LE(rel(next.x, next_ref.x), tol) << path << " " << dtype << " batch " << b;
      // Phases live in [0, 2π): one just below 2π in the reference may be just above 0 here.
      auto turn = next.angle.cpu().to(torch::kDouble) - next_ref.angle;
      turn = torch::remainder(turn + std::numbers::pi, 2 * std::numbers::pi) - std::numbers::pi;
      EXPECT_LE(turn.abs().max().item<double>() / (2 * std::numbers::pi), tol)
          << path << " " << dtype << " batch " << b;
      // The input state is left as it was (the step writes new tensors).
      EXPECT_TRUE(torch::equal(on_dev.ssm.cpu(), state.ssm.to(torch::kFloat)));
      // In place: the same bits, in the input's ssm buffer.
      auto in_place = on_dev;
      in_place.ssm = on_dev.ssm.clone();
      auto [y_in_place, next_in_place] = dev(x.to(device, dtype), in_place, torch::Tensor(), true);
      EXPECT_TRUE(next_in_place.ssm.is_same(in_place.ssm)) << path;
      EXPECT_TRUE(torch::equal(next_in_place.ssm.cpu(), next.ssm.cpu())) << path << " " << dtype << " batch " << b;
      EXPECT_TRUE(torch::equal(y_in_place.cpu(), y.cpu())) << path << " " << dtype << " batch " << b;
    }
  }
}

}  // namespace

TEST(Mamba3StepCuda, FusedStepMatchesTheFloat64LayerStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_fused_step_matches(torch::kCUDA, {torch::kFloat, torch::kBFloat16});
}

// The CPU loop (ops/mamba3_step_cpu.cpp), which an FP32 model's decode takes on the CPU.
TEST(Mamba3StepCpu, FusedStepMatchesTheFloat64LayerStep) {
  expect_fused_step_matches(torch::kCPU, {torch::kFloat});
  // A BF16 or float64 layer on the CPU keeps the libtorch step.
  Recipe r = load_recipe(source_path("recipes/tiny-hybrid.json"));
  model::Mamba3 d(r, torch::TensorOptions().dtype(torch::kDouble));
  torch::NoGradGuard no_grad;
  auto proj = d->in_proj(torch::randn({2, 1, r.d_model}, torch::kDouble)).view({2, -1});
  EXPECT_FALSE(ops::mamba3_step_fusable(proj, d->weights(), d->zero_state(2)));
}
