// The MoE's fused training combine (ops/moe_combine.h) against the tensor ops it replaces (the rows gathered through
// the inverse permutation, times the gates in the experts' dtype, summed over the k slots) and a float64 sum for the
// gate gradients. Runs on a CUDA device; the CPU build keeps the tensor ops.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "slm/ops/moe_combine.h"

using namespace slm;

TEST(MoeCombineCuda, EqualsTheTensorOpsAndTheirGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(23);
  for (auto dt : {torch::kBFloat16, torch::kFloat}) {
    for (int64_t k : {1, 2, 4, 8}) {
      for (int64_t d : {96, 1032}) {
        const int64_t n = 37;
        const auto o = torch::TensorOptions().device(torch::kCUDA);
        const auto ys = torch::randn({n * k, d}, o).to(dt).requires_grad_(true);
        const auto inv = torch::randperm(n * k, o.dtype(torch::kLong));
        const auto w = torch::rand({n, k}, o).requires_grad_(true);
        const auto up = torch::randn({n, d}, o).to(dt);
        ASSERT_TRUE(ops::moe_combine_fusable(ys, inv, w));
        const auto out = ops::moe_combine(ys, inv, w);
        const auto want = (ys.index_select(0, inv).view({n, k, d}) * w.to(dt).unsqueeze(-1)).sum(1);
        ASSERT_EQ(out.scalar_type(), dt);
        // The same rounded products, summed in FP32 in another order (torch's reduction interleaves accumulators)
        // and rounded once: within one rounding of the result (BF16) or k FP32 roundings of the products' sum.
        const auto mag =
            (ys.index_select(0, inv).view({n, k, d}) * w.to(dt).unsqueeze(-1)).abs().to(torch::kFloat).sum(1);
        const double ulp = dt == torch::kBFloat16 ? std::ldexp(1.0, -7) : k * std::ldexp(1.0, -23);
        EXPECT_TRUE(((out - want).abs().to(torch::kFloat) <= ulp * mag).all().item<bool>())
            << dt << " k " << k << " d " << d << ": " << (out - want).abs().max().item<double>();
        const auto got = torch::autograd::grad({out}, {ys, w}, {up});
        const auto ref = torch::autograd::grad({want}, {ys, w}, {up});
        EXPECT_TRUE(torch::equal(got[0], ref[0])) << "d ys " << dt << " k " << k << " d " << d;
        // dw[n, j] = Σ_i up[n, i] ys[inv[n k + j], i], here in float64 (the tensor ops round each product first).
        const auto rows = ys.detach().to(torch::kDouble).index_select(0, inv).view({n, k, d});
        const auto dw = (rows * up.to(torch::kDouble).unsqueeze(1)).sum(-1);
        const auto scale = (rows * up.to(torch::kDouble).unsqueeze(1)).abs().sum(-1);
        EXPECT_TRUE(((got[1].to(torch::kDouble) - dw).abs() <= 1e-6 * scale + 1e-12).all().item<bool>())
            << dt << " k " << k << " d " << d << ": max error "
            << (got[1].to(torch::kDouble) - dw).abs().max().item<double>();
      }
    }
  }
}

TEST(MoeCombineCuda, UnsupportedInputsAreNotFused) {
  const auto cpu = torch::randn({8, 16});
  EXPECT_FALSE(ops::moe_combine_fusable(cpu, torch::arange(8), torch::rand({4, 2}))) << "CPU tensors";
  EXPECT_THROW(ops::moe_combine(cpu, torch::arange(8), torch::rand({4, 2})), std::exception);
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto o = torch::TensorOptions().device(torch::kCUDA);
  EXPECT_FALSE(ops::moe_combine_fusable(torch::randn({8, 16}, o.dtype(torch::kDouble)), torch::arange(8, o),
                                        torch::rand({4, 2}, o)))
      << "float64";
  EXPECT_FALSE(ops::moe_combine_fusable(torch::randn({8, 12}, o).to(torch::kBFloat16), torch::arange(8, o),
                                        torch::rand({4, 2}, o)))
      << "rows of 12 BF16 values are not whole 16-byte vectors";
  EXPECT_FALSE(ops::moe_combine_fusable(torch::randn({18, 16}, o), torch::arange(18, o), torch::rand({2, 9}, o)))
      << "k 9";
}
