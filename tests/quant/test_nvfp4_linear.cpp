// The quantized linear layer against dequantize-then-matmul: CPU kernel on random shapes (ragged K and N,
// batches 1..16 and larger, stacked-expert slices), and the CUDA kernel when a GPU is present.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/util/error.h"

namespace nv = slm::nvfp4;

namespace {

// FP32 reference: dequantize W, then a plain matmul. Tolerance from the magnitudes of the products (|x| |W|^T),
// i.e. FP32 accumulation error over K terms.
void expect_matches_reference(const torch::Tensor& x, const nv::QTensor& w, const torch::Tensor& y) {
  torch::Tensor wd = nv::dequantize(w, torch::kFloat);
  torch::Tensor xf = x.to(torch::kCPU).to(torch::kFloat);
  torch::Tensor ref = torch::matmul(xf.to(torch::kDouble), wd.to(torch::kDouble).t());
  torch::Tensor mag = torch::matmul(xf.abs().to(torch::kDouble), wd.abs().to(torch::kDouble).t());
  torch::Tensor yc = y.to(torch::kCPU).to(torch::kDouble);
  ASSERT_EQ(yc.sizes(), ref.sizes());
  torch::Tensor err = (yc - ref).abs();
  torch::Tensor tol = mag * (4e-7 * std::sqrt(static_cast<double>(w.k())) + 1e-6) + 1e-30;
  EXPECT_TRUE((err <= tol).all().item<bool>())
      << "max error " << err.max().item<double>() << " max tol " << tol.max().item<double>();
  // The FP32 dequantize-then-matmul path agrees as well.
  torch::Tensor ref32 = torch::matmul(xf, wd.t()).to(torch::kDouble);
  EXPECT_TRUE(((yc - ref32).abs() <= tol * 2).all().item<bool>());
}

}  // namespace

// Every CPU kernel this machine runs. The AVX-512 BF16 kernel rounds x to BF16 first (as the CUDA GEMV does), so
// its reference takes the BF16-rounded x; the others compute with x as given.
TEST(Nvfp4Linear, CpuMatchesDequantizeThenMatmulOnRandomShapes) {
  for (auto kernel : {nv::CpuKernel::Avx512Bf16, nv::CpuKernel::Avx2, nv::CpuKernel::Portable}) {
    if (!nv::cpu_kernel_available(kernel)) {
      std::printf("[  NOTE    ] the %s kernel does not run on this CPU: not tested here\n",
                  nv::cpu_kernel_name(kernel));
      continue;
    }
    SCOPED_TRACE(nv::cpu_kernel_name(kernel));
    nv::set_cpu_kernel(kernel);
    const bool bf16_x = kernel == nv::CpuKernel::Avx512Bf16;
    torch::manual_seed(21);
    struct Case {
      int64_t M, N, K;
    };
    // K of 1 to 43 blocks: odd and even block counts, one or many 64-element steps, a ragged last block.
    std::vector<Case> cases = {{1, 1, 1},     {1, 7, 16},   {2, 33, 37},  {3, 64, 64},   {4, 17, 100},
                               {5, 40, 250},  {8, 129, 48}, {13, 9, 513}, {16, 96, 160}, {21, 31, 77},
                               {1, 300, 688}, {1, 5, 32},   {2, 3, 96}};
    for (const auto& c : cases) {
      SCOPED_TRACE(::testing::Message() << "M " << c.M << " N " << c.N << " K " << c.K);
      torch::Tensor wf = torch::randn({c.N, c.K}) * torch::exp(torch::randn({c.N, c.K}));
      nv::QTensor w = nv::quantize(wf.to(torch::kBFloat16));
      torch::Tensor x = torch::randn({c.M, c.K});
      torch::Tensor y = nv::linear(x, w);
      EXPECT_EQ(y.scalar_type(), torch::kFloat);
      expect_matches_reference(bf16_x ? x.to(torch::kBFloat16) : x, w, y);
    }
    // Block scales across the E4M3 range, subnormal ones included, in one row: a wrong scale decode shows.
    torch::Tensor wf =
        torch::randn({4, 256}) * torch::pow(2.0, torch::arange(-16, 0).repeat_interleave(16)).view({1, 256});
    wf[1] *= -1;
    nv::QTensor w = nv::quantize(wf);
    torch::Tensor x = torch::randn({3, 256});
    expect_matches_reference(bf16_x ? x.to(torch::kBFloat16) : x, w, nv::linear(x, w));
  }
  nv::set_cpu_kernel(nv::CpuKernel::Auto);
}

TEST(Nvfp4Linear, CpuAcceptsBatchDimsHalfInputsAndExpertSlices) {
  torch::manual_seed(22);
  nv::QTensor experts = nv::quantize(torch::randn({3, 24, 40}));
  torch::Tensor x = torch::randn({2, 3, 40}).to(torch::kBFloat16);
  for (int e = 0; e < 3; ++e) {
    nv::QTensor w = experts.matrix(e);
    torch::Tensor y = nv::linear(x, w);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 24}));
    expect_matches_reference(x.reshape({-1, 40}), w, y.reshape({-1, 24}));
  }
  // Zero weights and zero-row batches.
  nv::QTensor z = nv::quantize(torch::zeros({5, 20}));
  EXPECT_TRUE(torch::equal(nv::linear(torch::randn({2, 20}), z), torch::zeros({2, 5})));
  EXPECT_EQ(nv::linear(torch::randn({0, 20}), z).sizes(), (std::vector<int64_t>{0, 5}));
}

TEST(Nvfp4Linear, RejectsMismatchedInputs) {
  nv::QTensor w = nv::quantize(torch::randn({4, 32}));
  EXPECT_THROW(nv::linear(torch::randn({2, 31}), w), slm::Error);
  EXPECT_THROW(nv::linear(torch::randn({2, 32}), nv::quantize(torch::randn({2, 4, 32}))), slm::Error);
  EXPECT_THROW(nv::linear(torch::ones({2, 32}, torch::kInt), w), slm::Error);
}

TEST(Nvfp4LinearCuda, MatchesDequantizeThenMatmul) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!nv::cuda_kernels_built()) GTEST_SKIP() << "built without SLM_CUDA";
  torch::manual_seed(23);
  struct Case {
    int64_t M, N, K;
  };
  // Even and odd block counts (16-byte and 8-byte load paths), ragged K and N, batches 1..16 (the GEMV) and more
  // than 264 row tiles (the launcher's 8-warp configuration); from 17 rows the BF16 GEMM path, ragged shapes and
  // prefill-sized batches included.
  std::vector<Case> cases = {{1, 1, 16},     {1, 4096, 4096},  {1, 1000, 4112},  {2, 33, 37},      {3, 257, 1000},
                             {4, 64, 11008}, {7, 130, 48},     {8, 1024, 4096},  {16, 300, 160},   {16, 77, 513},
                             {19, 65, 96},   {1, 4300, 160},   {3, 4313, 256},   {12, 4500, 48},   {17, 1, 16},
                             {17, 77, 513},  {64, 1024, 4096}, {300, 257, 1000}, {2048, 512, 160}, {4096, 1000, 37}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "M " << c.M << " N " << c.N << " K " << c.K);
    nv::QTensor w = nv::quantize(torch::randn({c.N, c.K}).to(torch::kBFloat16));
    torch::Tensor x = torch::randn({c.M, c.K}).to(torch::kBFloat16);
    torch::Tensor y = nv::linear(x.to(torch::kCUDA), w.to(torch::kCUDA));
    EXPECT_TRUE(y.is_cuda());
    EXPECT_EQ(y.scalar_type(), torch::kFloat);
    expect_matches_reference(x, w, y);
    // Same result as the CPU kernel on the same BF16 activations, to FP32 accumulation-order differences.
    torch::Tensor yc = nv::linear(x.to(torch::kFloat), w);
    EXPECT_TRUE(torch::allclose(y.cpu(), yc, 1e-4, 1e-4));
  }
  // A slice of stacked experts at an offset that is only 8-byte aligned, through both paths (its own tensor scale).
  nv::QTensor experts =
      nv::quantize(torch::randn({3, 5, 48}) * torch::tensor({1.0f, 30.0f, 0.01f}).view({3, 1, 1})).to(torch::kCUDA);
  for (int64_t M : {2, 40}) {
    torch::Tensor x = torch::randn({M, 48}).to(torch::kBFloat16);
    for (int e = 0; e < 3; ++e)
      expect_matches_reference(x, experts.matrix(e).to(torch::kCPU), nv::linear(x.to(torch::kCUDA), experts.matrix(e)));
  }
}

// The routed experts' GEMVs, gathered and grouped: each assignment a against its own expert's dequantized matrix and x
// row a / x_div, in float64. Stacks whose matrices start 16-byte aligned (the 16-byte loads) and ones that do not
// (N * blocks odd), matrices scaled apart so that a wrong tensor scale shows, more assignments than the 264-CTA
// configuration switch, experts with no rows and ones with more than one 16-row chunk.
TEST(Nvfp4LinearCuda, GatheredExpertsMatchEachAssignmentsMatrix) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!nv::cuda_kernels_built()) GTEST_SKIP() << "built without SLM_CUDA";
  torch::manual_seed(25);
  struct Case {
    int64_t E, N, K, rows, x_div;
  };
  for (const Case c : std::vector<Case>{{16, 192, 384, 1, 2},
                                        {16, 384, 96, 2, 1},
                                        {5, 33, 37, 3, 2},
                                        {3, 7, 48, 70, 1},
                                        {8, 1000, 160, 64, 2},
                                        {4, 130, 4112, 1, 4}}) {
    SCOPED_TRACE(::testing::Message() << "E " << c.E << " N " << c.N << " K " << c.K << " rows " << c.rows);
    auto magnitudes = torch::exp(torch::randn({c.E, 1, 1}) * 3);
    nv::QTensor w = nv::quantize((torch::randn({c.E, c.N, c.K}) * magnitudes).to(torch::kBFloat16));
    torch::Tensor x = torch::randn({c.rows, c.K}).to(torch::kBFloat16);
    torch::Tensor ids = torch::randint(0, c.E, {c.rows * c.x_div}, torch::kLong);
    // The grouped form takes the assignments sorted by expert and each run's end (computed here on the host).
    torch::Tensor order = std::get<1>(torch::sort(ids, /*stable=*/true, 0, false));
    torch::Tensor ends = torch::zeros({c.E}, torch::kLong).scatter_add_(0, ids, torch::ones_like(ids)).cumsum(0);
    const auto wc = w.to(torch::kCUDA);
    const torch::Tensor ys[] = {
        nv::gathered_linear_cuda(x.cuda(), wc, ids.cuda(), c.x_div),
        nv::grouped_linear_cuda(x.cuda(), wc, order.cuda(), ends.to(torch::kInt).cuda(), c.x_div)};
    torch::Tensor wd = nv::dequantize(w, torch::kDouble);
    auto id = ids.accessor<int64_t, 1>();
    for (int form = 0; form < 2; ++form) {
      const auto& y = ys[form];
      ASSERT_EQ(y.sizes(), (std::vector<int64_t>{c.rows * c.x_div, c.N}));
      for (int64_t a = 0; a < ids.size(0); ++a) {
        torch::Tensor xa = x[a / c.x_div].to(torch::kDouble), we = wd[id[a]];
        torch::Tensor ref = torch::mv(we, xa), mag = torch::mv(we.abs(), xa.abs());
        torch::Tensor err = (y[a].cpu().to(torch::kDouble) - ref).abs();
        ASSERT_TRUE((err <= mag * (4e-7 * std::sqrt(static_cast<double>(c.K)) + 1e-6) + 1e-30).all().item<bool>())
            << (form ? "grouped" : "gathered") << " assignment " << a << " (expert " << id[a] << "): max error "
            << err.max().item<double>();
      }
    }
  }
  nv::QTensor w = nv::quantize(torch::randn({4, 8, 32})).to(torch::kCUDA);
  auto x = torch::randn({2, 32}, torch::kCUDA);
  EXPECT_THROW(nv::gathered_linear_cuda(x, w, torch::zeros({5}, torch::kLong).cuda(), 2), slm::Error);  // 3 rows
  EXPECT_THROW(nv::gathered_linear_cuda(x, w, torch::zeros({2}, torch::kInt).cuda(), 1), slm::Error);
  EXPECT_THROW(nv::gathered_linear_cuda(x, w.matrix(0), torch::zeros({2}, torch::kLong).cuda(), 1), slm::Error);
  EXPECT_THROW(
      nv::grouped_linear_cuda(x, w, torch::zeros({2}, torch::kLong).cuda(), torch::zeros({3}, torch::kInt).cuda(), 1),
      slm::Error);  // ends for 3 experts of 4
}

// A BF16 output is written by the kernels themselves (no cast kernel in a decode step): it must be the FP32 result
// (checked against float64 above) rounded to nearest even, as torch's cast rounds it, for every form and batch size
// (the 17-row product takes the dequantize + GEMM path).
TEST(Nvfp4LinearCuda, Bf16OutputIsTheFloatResultRounded) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!nv::cuda_kernels_built()) GTEST_SKIP() << "built without SLM_CUDA";
  torch::manual_seed(26);
  const auto bf16 = torch::kBFloat16;
  nv::QTensor w = nv::quantize(torch::randn({6, 200, 256}) * 3).to(torch::kCUDA);
  for (int64_t rows : {1, 3, 16, 17}) {
    SCOPED_TRACE(rows);
    auto x = torch::randn({rows, 256}, torch::kCUDA).to(bf16);
    auto plain = nv::linear(x, w.matrix(2), bf16);
    ASSERT_EQ(plain.scalar_type(), bf16);
    EXPECT_TRUE(torch::equal(plain, nv::linear(x, w.matrix(2)).to(bf16)));
    auto ids = torch::randint(0, 6, {rows * 2}, torch::dtype(torch::kLong).device(torch::kCUDA));
    auto gathered = nv::gathered_linear_cuda(x, w, ids, 2, bf16);
    ASSERT_EQ(gathered.scalar_type(), bf16);
    EXPECT_TRUE(torch::equal(gathered, nv::gathered_linear_cuda(x, w, ids, 2).to(bf16)));
    auto order = std::get<1>(torch::sort(ids, /*stable=*/true, 0, false));
    auto ends = torch::zeros({6}, ids.options()).scatter_add_(0, ids, torch::ones_like(ids)).cumsum(0).to(torch::kInt);
    EXPECT_TRUE(torch::equal(nv::grouped_linear_cuda(x, w, order, ends, 2, bf16),
                             nv::grouped_linear_cuda(x, w, order, ends, 2).to(bf16)));
  }
}

TEST(Nvfp4LinearCuda, DequantizeOnTheGpuEqualsTheCpuDecode) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(24);
  nv::QTensor q = nv::quantize(torch::randn({3, 40, 70}) * torch::exp(torch::randn({3, 40, 70})));
  torch::Tensor d = nv::dequantize(q.to(torch::kCUDA), torch::kFloat);
  EXPECT_TRUE(d.is_cuda());
  EXPECT_TRUE(torch::equal(d.cpu(), nv::dequantize(q, torch::kFloat)));
}
