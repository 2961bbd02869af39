// ops::rms_norm: the CPU inference loop against a float64 reference written out here, with and without a weight,
// ragged widths and many rows; where a gradient is needed it must be libtorch's differentiable rms_norm.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "slm/ops/rms_norm.h"
#include "slm/util/error.h"

namespace {

torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  auto xd = x.to(torch::kDouble).reshape({-1, x.size(-1)});
  auto out = torch::empty_like(xd);
  const int64_t d = xd.size(1);
  auto xa = xd.accessor<double, 2>();
  auto oa = out.accessor<double, 2>();
  for (int64_t r = 0; r < xd.size(0); ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += xa[r][i] * xa[r][i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t i = 0; i < d; ++i) oa[r][i] = xa[r][i] * inv * (w.defined() ? w[i].item<double>() : 1.0);
  }
  return out.view(x.sizes());
}

}  // namespace

TEST(RmsNorm, CpuLoopMatchesTheFloat64Reference) {
  torch::manual_seed(5);
  for (int64_t d : {1, 7, 8, 33, 512, 1000}) {
    for (bool weighted : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "d " << d << (weighted ? " weighted" : ""));
      auto x = torch::randn({3, 5, d}) * 3.0;
      torch::Tensor w = weighted ? torch::randn({d}) : torch::Tensor();
      const double eps = 1e-6;
      auto y = slm::ops::rms_norm_cpu_loop(x, weighted ? std::optional<torch::Tensor>(w) : std::nullopt, eps);
      auto ref = reference(x, w, eps);
      EXPECT_EQ(y.sizes(), x.sizes());
      EXPECT_TRUE(torch::allclose(y.to(torch::kDouble), ref, 1e-6, 1e-6))
          << (y.to(torch::kDouble) - ref).abs().max().item<double>();
      // And the same numbers as libtorch's rms_norm, to float rounding.
      auto at_y = at::rms_norm(x, {d}, weighted ? std::optional<at::Tensor>(w) : std::nullopt, eps);
      EXPECT_TRUE(torch::allclose(y, at_y, 1e-5, 1e-6));
    }
  }
  // eps matters for a zero row: x / sqrt(eps), not NaN.
  auto z = slm::ops::rms_norm_cpu_loop(torch::zeros({2, 4}), std::nullopt, 1e-5);
  EXPECT_TRUE(torch::equal(z, torch::zeros({2, 4})));
  // A non-contiguous input (a transposed view) reads its logical rows.
  auto xt = torch::randn({6, 4}).t();
  EXPECT_TRUE(torch::allclose(slm::ops::rms_norm_cpu_loop(xt, std::nullopt, 1e-6).to(torch::kDouble),
                              reference(xt.contiguous(), {}, 1e-6), 1e-6, 1e-6));
  EXPECT_THROW(slm::ops::rms_norm_cpu_loop(torch::randn({2, 4}).to(torch::kDouble), std::nullopt, 1e-6), slm::Error);
  EXPECT_THROW(slm::ops::rms_norm_cpu_loop(torch::randn({2, 4}), torch::randn({5}), 1e-6), slm::Error);
}

TEST(RmsNorm, GradientsFlowWhereNeeded) {
  torch::manual_seed(6);
  auto x = torch::randn({4, 16}, torch::requires_grad());
  auto w = torch::randn({16}, torch::requires_grad());
  auto y = slm::ops::rms_norm(x, w, 1e-6);
  ASSERT_TRUE(y.requires_grad());
  y.pow(2).sum().backward();
  auto x2 = x.detach().clone().requires_grad_(true), w2 = w.detach().clone().requires_grad_(true);
  at::rms_norm(x2, {16}, w2, 1e-6).pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(w.grad(), w2.grad(), 1e-5, 1e-6));
  // Under no_grad the same parameters take the loop (its result is a plain tensor) and give the same values.
  torch::NoGradGuard no_grad;
  auto fast = slm::ops::rms_norm(x, w, 1e-6);
  EXPECT_FALSE(fast.requires_grad());
  EXPECT_TRUE(torch::equal(fast, slm::ops::rms_norm_cpu_loop(x, w, 1e-6)));
  // Other dtypes go to libtorch.
  auto xb = x.to(torch::kBFloat16);
  EXPECT_EQ(slm::ops::rms_norm(xb, w.to(torch::kBFloat16), 1e-6).scalar_type(), torch::kBFloat16);
}

// A BF16 input with an FP32 weight (a QK-norm under autocast) on CUDA: the output, the input's gradient and the FP32
// weight's gradient against float64 (the weight's gradient is Σ_rows x̂ · g, the input's the usual RMSNorm one).
TEST(RmsNormCuda, Bf16InputWithFp32WeightMatchesFloat64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(6);
  const int64_t d = 128;
  const double eps = 1e-6;
  auto x64 = torch::randn({64, 4, d}, torch::kDouble) * 2.0;
  auto w64 = torch::rand({d}, torch::kDouble) + 0.5;
  auto g64 = torch::randn({64, 4, d}, torch::kDouble);
  auto x = x64.to(torch::kCUDA, torch::kBFloat16).set_requires_grad(true);
  auto w = w64.to(torch::kCUDA, torch::kFloat).set_requires_grad(true);
  auto y = slm::ops::rms_norm(x, w, eps);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  (y.to(torch::kDouble) * g64.to(torch::kCUDA)).sum().backward();
  // The reference reads the same rounded input; autograd in float64 gives its gradients.
  auto xr = x.detach().to(torch::kCPU, torch::kDouble).set_requires_grad(true);
  auto wr = w.detach().to(torch::kCPU, torch::kDouble).set_requires_grad(true);
  auto yr = xr * torch::rsqrt(xr.pow(2).mean(-1, true) + eps) * wr;
  (yr * g64).sum().backward();
  auto close = [](const torch::Tensor& a, const torch::Tensor& b, double rel) {
    return (a.to(torch::kCPU, torch::kDouble) - b).abs().max().item<double>() <= rel * b.abs().max().item<double>();
  };
  EXPECT_TRUE(close(y, yr.detach(), 1e-2));
  EXPECT_TRUE(close(x.grad(), xr.grad(), 2e-2));
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat);
  EXPECT_TRUE(close(w.grad(), wr.grad(), 1e-2));
}
