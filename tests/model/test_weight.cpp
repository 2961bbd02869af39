// model::Weight, the one form a weight runs in: dense (the registered parameter) or NVFP4 (its codes, the parameter
// released), for one matrix and for a stack of experts, against float64 loops over the dense or dequantized values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "quant/nvfp4_fp32_kernel.h"
#include "slm/model/weight.h"
#include "slm/util/error.h"

using namespace slm;

namespace {

// y[i][o] = sum_k x[i][k] w[o][k], in float64 loops.
torch::Tensor loop_product(const torch::Tensor& x, const torch::Tensor& w) {
  auto xd = x.to(torch::kDouble).contiguous(), wd = w.to(torch::kDouble).contiguous();
  auto y = torch::zeros({xd.size(0), wd.size(0)}, torch::kDouble);
  auto xa = xd.accessor<double, 2>(), wa = wd.accessor<double, 2>();
  auto ya = y.accessor<double, 2>();
  for (int64_t i = 0; i < xd.size(0); ++i)
    for (int64_t o = 0; o < wd.size(0); ++o)
      for (int64_t k = 0; k < xd.size(1); ++k) ya[i][o] += xa[i][k] * wa[o][k];
  return y;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST(Weight, DenseMultipliesByTheParameterItself) {
  torch::manual_seed(1);
  auto p = torch::randn({5, 32}, torch::kDouble);
  model::Weight w(p);
  auto x = torch::randn({3, 32}, torch::kDouble);
  EXPECT_FALSE(w.is_nvfp4());
  EXPECT_LT(max_diff(w.linear(x), loop_product(x, p)), 1e-12);
  EXPECT_TRUE(w.dense().is_same(p)) << "the handle is the registered parameter";
  EXPECT_EQ(w.bytes(), 5 * 32 * 8);
  EXPECT_THROW(w.nvfp4(), Error);
}

TEST(Weight, Nvfp4ReplacesTheDenseFormAndKeepsItsDtype) {
  test::Fp32Nvfp4Kernel exact;
  torch::manual_seed(2);
  auto p = torch::randn({6, 48});
  model::Weight w(p);
  auto q = nvfp4::quantize(p);
  const auto dequantized = nvfp4::dequantize(q, torch::kFloat);
  w.use_nvfp4(q, "layers.0.w");
  EXPECT_TRUE(w.is_nvfp4());
  EXPECT_EQ(p.numel(), 0) << "the dense storage is released";
  EXPECT_EQ(p.scalar_type(), torch::kFloat);
  // 6 rows of 3 blocks of 16: 8 bytes of codes and one scale byte each, and one 4-byte tensor scale.
  EXPECT_EQ(w.bytes(), 6 * 3 * 9 + 4);
  torch::NoGradGuard no_grad;
  auto x = torch::randn({4, 48});
  EXPECT_LT(max_diff(w.linear(x), loop_product(x, dequantized)), 1e-4);
}

TEST(Weight, Nvfp4IsInferenceOnlyAndShapesMustAgree) {
  model::Weight w(torch::randn({4, 32}));
  EXPECT_THROW(w.use_nvfp4(nvfp4::quantize(torch::randn({4, 48})), "layers.3.w"), Error);
  try {
    w.use_nvfp4(nvfp4::quantize(torch::randn({5, 32})), "layers.3.w");
    FAIL() << "a [5, 32] matrix replaced a [4, 32] weight";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.3.w"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(w.is_nvfp4()) << "a refused matrix changes nothing";
  EXPECT_EQ(w.dense().numel(), 4 * 32);
  w.use_nvfp4(nvfp4::quantize(w.dense()), "layers.3.w");
  EXPECT_THROW(w.linear(torch::randn({1, 32}, torch::requires_grad())), Error);
}

TEST(Weight, AStackMultipliesByOneExpertsMatrix) {
  test::Fp32Nvfp4Kernel exact;
  torch::manual_seed(3);
  auto p = torch::randn({3, 8, 32});
  model::Weight dense(p.clone()), packed(p.clone());
  auto q = nvfp4::quantize(p);
  const auto dequantized = nvfp4::dequantize(q, torch::kFloat);
  packed.use_nvfp4(q, "experts.w13");
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 32});
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_LT(max_diff(dense.linear(x, e), loop_product(x, p[e])), 1e-4) << e;
    EXPECT_LT(max_diff(packed.linear(x, e), loop_product(x, dequantized[e])), 1e-4) << e;
    EXPECT_EQ(packed.nvfp4(e).shape, (std::vector<int64_t>{8, 32}));
  }
  EXPECT_THROW(model::Weight(torch::randn({8, 32})).nvfp4(0), Error);
}
