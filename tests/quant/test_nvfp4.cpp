// NVFP4 numbers: E4M3 and E2M1 conversions against the float64 reference, the two-level encoding on a
// hand-computed block, exact round trips, error bounds on random tensors and the NaN/Inf-free edge cases.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>

#include "quant/nvfp4_reference.h"
#include "slm/quant/nvfp4.h"
#include "slm/recipe/accounting.h"
#include "slm/util/error.h"

namespace nv = slm::nvfp4;
namespace ref = slm::test::nvfp4ref;

namespace {

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::vector<uint8_t> bytes_of(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return std::vector<uint8_t>(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
}

void expect_all_finite(const torch::Tensor& t) {
  EXPECT_TRUE(torch::isfinite(t.to(torch::kFloat)).all().item<bool>()) << t;
}

}  // namespace

TEST(Nvfp4E4M3, DecodesAll256CodesLikeTheFieldDefinition) {
  for (int c = 0; c < 256; ++c) {
    double want = ref::e4m3_value(c);
    float got = nv::e4m3_decode(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
  }
  EXPECT_EQ(nv::e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(nv::e4m3_decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(nv::e4m3_decode(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(nv::e4m3_decode(0x38), 1.0f);
}

TEST(Nvfp4E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(nv::e4m3_encode_rne(nv::e4m3_decode(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(Nvfp4E4M3, RoundsToNearestEvenLikeBruteForce) {
  // Every midpoint between neighbours, one FP32 ulp either side, and random values across the whole range.
  for (int c = 0; c < 0x7E; ++c) {
    float lo = static_cast<float>(ref::e4m3_value(c)), hi = static_cast<float>(ref::e4m3_value(c + 1));
    float mid = 0.5f * (lo + hi);  // exact in FP32
    ASSERT_EQ(static_cast<double>(mid), 0.5 * (ref::e4m3_value(c) + ref::e4m3_value(c + 1)));
    int even = (c & 1) == 0 ? c : c + 1;
    EXPECT_EQ(nv::e4m3_encode_rne(mid), even) << "midpoint " << mid;
    EXPECT_EQ(nv::e4m3_encode_rne(std::nextafter(mid, 0.0f)), c) << mid;
    EXPECT_EQ(nv::e4m3_encode_rne(std::nextafter(mid, 1e9f)), c + 1) << mid;
    EXPECT_EQ(nv::e4m3_encode_rne(-mid), even | 0x80) << mid;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> expo(-14.0, 9.5);
  for (int i = 0; i < 20000; ++i) {
    float v = static_cast<float>(std::exp2(expo(rng)));
    EXPECT_EQ(nv::e4m3_encode_rne(v), ref::e4m3_nearest(v)) << v;
  }
}

TEST(Nvfp4E4M3, SaturatesAndHandlesSpecials) {
  EXPECT_EQ(nv::e4m3_encode_rne(449.0f), 0x7E);
  EXPECT_EQ(nv::e4m3_encode_rne(1e30f), 0x7E);
  EXPECT_EQ(nv::e4m3_encode_rne(INFINITY), 0x7E);
  EXPECT_EQ(nv::e4m3_encode_rne(-1e30f), 0xFE);
  EXPECT_EQ(nv::e4m3_encode_rne(NAN), 0x7F);
  EXPECT_EQ(nv::e4m3_encode_rne(1e-40f), 0x00);  // FP32 denormal
  EXPECT_EQ(nv::e4m3_encode_rne(0.0f), 0x00);
  EXPECT_EQ(nv::e4m3_encode_rne(std::ldexp(1.0f, -10)), 0x00);         // half the smallest subnormal: tie to 0
  EXPECT_EQ(nv::e4m3_encode_rne(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(nv::e4m3_encode_rne(std::ldexp(3.0f, -10)), 0x02);         // tie between codes 1 and 2: even
  EXPECT_EQ(nv::e4m3_encode_rne(std::ldexp(15.0f, -10)), 0x08);        // tie between 7 and 8 (first normal)
}

TEST(Nvfp4E2M1, DecodesTheGridAndSign) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(nv::e2m1_decode(static_cast<uint8_t>(c)), want[c]) << c;
    EXPECT_EQ(std::signbit(nv::e2m1_decode(static_cast<uint8_t>(c))), c >= 8) << c;
    EXPECT_EQ(nv::e2m1_encode_rne(want[c]), c) << c;
  }
}

TEST(Nvfp4E2M1, RoundsToNearestEvenAndSaturates) {
  // Midpoints go to the even code: .25->0, .75->1.0, 1.25->1.0, 1.75->2, 2.5->2, 3.5->4, 5->4.
  EXPECT_EQ(nv::e2m1_encode_rne(0.25f), 0);
  EXPECT_EQ(nv::e2m1_encode_rne(0.75f), 2);
  EXPECT_EQ(nv::e2m1_encode_rne(1.25f), 2);
  EXPECT_EQ(nv::e2m1_encode_rne(1.75f), 4);
  EXPECT_EQ(nv::e2m1_encode_rne(2.5f), 4);
  EXPECT_EQ(nv::e2m1_encode_rne(3.5f), 6);
  EXPECT_EQ(nv::e2m1_encode_rne(5.0f), 6);
  EXPECT_EQ(nv::e2m1_encode_rne(5.01f), 7);
  EXPECT_EQ(nv::e2m1_encode_rne(6.4f), 7);
  EXPECT_EQ(nv::e2m1_encode_rne(1e30f), 7);
  EXPECT_EQ(nv::e2m1_encode_rne(-2.6f), 8 | 5);
  EXPECT_EQ(nv::e2m1_encode_rne(-0.1f), 8);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-7.0f, 7.0f);
  for (int i = 0; i < 20000; ++i) {
    float v = u(rng);
    int want = ref::e2m1_nearest(std::fabs(v)) | (v < 0 ? 8 : 0);
    EXPECT_EQ(nv::e2m1_encode_rne(v), want) << v;
  }
}

TEST(Nvfp4E2M1, StochasticRoundingPicksANeighbourWithTheRightOdds) {
  // Between 2 and 3, 2.25 rounds up with probability 1/4.
  int up = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    float u = (i + 0.5f) / n;
    uint8_t c = nv::e2m1_encode_stochastic(2.25f, u);
    ASSERT_TRUE(c == 4 || c == 5) << int(c);
    up += c == 5;
  }
  EXPECT_EQ(up, n / 4);
  for (int c = 0; c < 16; ++c)  // grid points never move
    for (float u : {0.0f, 0.5f, 0.999f}) EXPECT_EQ(nv::e2m1_encode_stochastic(nv::e2m1_decode(c), u), c);
  EXPECT_EQ(nv::e2m1_encode_stochastic(9.0f, 0.0f), 7);
  EXPECT_EQ(nv::e2m1_encode_stochastic(-0.1f, 0.99f), 8);
  EXPECT_EQ(nv::e2m1_encode_stochastic(-0.1f, 0.1f), 9);
}

// One block worked by hand. amax = 12, so s_enc = 2688/12 = 224 and the tensor scale is fp32(1/224). The block
// scale is e4m3(12/6 * 224) = e4m3(448) = 0x7E (exponent field 15, mantissa 6: 1.75 * 2^8), so the element scale
// is 1/(448/224) = 1/2 (to FP32 rounding) and each code is the E2M1 value nearest x/2.
TEST(Nvfp4Encode, HandComputedBlock) {
  std::vector<float> x = {0, 0.6f, -1.2f, 2.0f, 2.4f, -3.6f, 4.4f, 5.4f, -6.2f, 7.2f, 9.0f, -10.6f, 12.0f, 0.2f, -0.9f, 11.0f};
  // x/2 = 0 .3 -.6 1 1.2 -1.8 2.2 2.7 -3.1 3.6 4.5 -5.3 6 .1 -.45 5.5
  // ->    0 .5 -.5 1 1   -2   2   3   -3   4   4   -6   6 0  -.5  6
  std::vector<int> codes = {0, 1, 9, 2, 2, 12, 4, 5, 13, 6, 6, 15, 7, 0, 9, 7};
  std::vector<uint8_t> packed = {0x10, 0x29, 0xC2, 0x54, 0x6D, 0xF6, 0x07, 0x79};
  nv::QTensor q = nv::quantize(torch::tensor(x));
  EXPECT_EQ(q.tensor_scale.item<float>(), static_cast<float>(1.0 / 224.0));
  EXPECT_EQ(bytes_of(q.scales), std::vector<uint8_t>{0x7E});
  EXPECT_EQ(bytes_of(q.codes), packed);
  auto unpacked = bytes_of(nv::unpack_codes(q));
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(unpacked[i], codes[i]) << i;
  std::vector<float> decoded = {0, 1, -1, 2, 2, -4, 4, 6, -6, 8, 8, -12, 12, 0, -1, 12};
  torch::Tensor d = nv::dequantize(q);
  for (size_t i = 0; i < decoded.size(); ++i) EXPECT_NEAR(d[i].item<float>(), decoded[i], 1e-6) << i;
}

// Tensors built from every E2M1 value times power-of-two-friendly scales encode to exactly those codes and
// decode to exactly the input: amax = 2688 * 2^e makes s_dec = 2^e exact, and a block whose amax is 6 * S * 2^e
// (S any E4M3 value) gets block scale S exactly.
TEST(Nvfp4Encode, EveryE2M1ValueTimesManyScalesRoundTripsExactly) {
  std::vector<int> block_scales;
  for (int c = 1; c <= 0x7E; c += 5) block_scales.push_back(c);
  for (int e : {-100, -40, -13, -1, 0, 1, 7, 30, 100}) {
    const float s_dec = std::ldexp(1.0f, e);
    std::vector<float> x;
    std::vector<int> want_scales, want_codes;
    // Block 0 has scale 448 and sets the matrix amax; the others use the chosen E4M3 values.
    std::vector<int> scales_here = {0x7E};
    scales_here.insert(scales_here.end(), block_scales.begin(), block_scales.end());
    for (size_t b = 0; b < scales_here.size(); ++b) {
      int S = scales_here[b];
      double Sv = ref::e4m3_value(S);
      for (int i = 0; i < 16; ++i) {
        int code = (i + static_cast<int>(b)) % 16;
        if (i == 0) code = 7;  // each block holds its +6 so its amax is 6 * S * s_dec
        x.push_back(static_cast<float>(ref::e2m1_value(code) * Sv * s_dec));
        want_codes.push_back(code);
      }
      want_scales.push_back(S);
    }
    nv::QTensor q = nv::quantize(torch::tensor(x).reshape({static_cast<long>(scales_here.size()), 16}));
    ASSERT_EQ(q.tensor_scale.item<float>(), s_dec) << e;
    auto s = bytes_of(q.scales);
    for (size_t b = 0; b < want_scales.size(); ++b) EXPECT_EQ(s[b], want_scales[b]) << "e=" << e << " block " << b;
    auto c = bytes_of(nv::unpack_codes(q));
    for (size_t i = 0; i < want_codes.size(); ++i) EXPECT_EQ(c[i], want_codes[i]) << "e=" << e << " i=" << i;
    torch::Tensor d = nv::dequantize(q).reshape({-1});
    const float* dp = d.data_ptr<float>();
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(dp[i], x[i]) << "e=" << e << " i=" << i;
      if (x[i] == 0.0f) {
        EXPECT_EQ(std::signbit(dp[i]), std::signbit(x[i])) << i;
      }
    }
  }
}

namespace {

// Checks q against the float64 reference: tensor scales exactly, block scales and codes up to near-ties, and
// the element error bound |x - x^| <= amax_b / 6 * (1 + 1/16) (half the widest E2M1 step at the block's
// scale, with the block scale's E4M3 rounding) plus a tiny FP32 slack.
void check_against_reference(const torch::Tensor& x_in, const nv::QTensor& q) {
  torch::Tensor x = x_in.to(torch::kDouble).contiguous();
  const int64_t K = q.k(), rows = q.rows(), rpm = q.rows_per_matrix(), blocks = q.blocks_per_row();
  ASSERT_EQ(q.numel(), x.numel());
  const double* xp = x.data_ptr<double>();
  auto scales = bytes_of(q.scales);
  auto codes = bytes_of(nv::unpack_codes(q));
  torch::Tensor d = nv::dequantize(q, torch::kDouble).contiguous();
  const double* dp = d.data_ptr<double>();
  const float* tsp = q.tensor_scale.data_ptr<float>();
  for (int64_t m = 0; m < q.matrices(); ++m) {
    double amax = 0;
    for (int64_t i = m * rpm * K; i < (m + 1) * rpm * K; ++i) amax = std::max(amax, std::fabs(xp[i]));
    ASSERT_EQ(tsp[m], ref::s_dec_of(amax)) << "matrix " << m;
  }
  int64_t near_ties = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float s_enc = ref::s_enc_of(0), s_dec = tsp[r / rpm];
    {
      double amax = 0;
      int64_t m = r / rpm;
      for (int64_t i = m * rpm * K; i < (m + 1) * rpm * K; ++i) amax = std::max(amax, std::fabs(xp[i]));
      s_enc = ref::s_enc_of(amax);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t k0 = b * 16, n = std::min<int64_t>(16, K - k0);
      double amax_b = 0;
      for (int64_t i = 0; i < n; ++i) amax_b = std::max(amax_b, std::fabs(xp[r * K + k0 + i]));
      int S = scales[r * blocks + b];
      auto ok_scales = ref::e4m3_acceptable(amax_b / 6.0 * s_enc);
      ASSERT_TRUE(contains(ok_scales, S)) << "row " << r << " block " << b << " scale " << S << " target "
                                          << amax_b / 6.0 * s_enc;
      if (ok_scales.size() > 1) ++near_ties;
      double Sv = ref::e4m3_value(S);
      for (int64_t i = 0; i < n; ++i) {
        int64_t idx = r * K + k0 + i;
        int c = codes[idx];
        if (Sv == 0.0) {
          EXPECT_EQ(c & 7, 0) << idx;
        } else {
          auto ok = ref::e2m1_acceptable(xp[idx] / (Sv * s_dec));
          EXPECT_TRUE(contains(ok, c)) << "element " << idx << " x=" << xp[idx] << " code " << c;
        }
        EXPECT_NEAR(dp[idx], ref::e2m1_value(c) * Sv * s_dec, 1e-6 * std::fabs(dp[idx]) + 1e-300) << idx;
        double bound = amax_b / 6.0 * (1.0 + 1.0 / 16.0) * (1 + 1e-5);
        if (Sv > 0.0 && Sv >= std::ldexp(1.0, -6)) {  // normal block scales: the format's relative bound
          EXPECT_LE(std::fabs(dp[idx] - xp[idx]), bound) << "element " << idx;
        }
      }
    }
  }
  EXPECT_LE(near_ties, rows * blocks / 100 + 1);
}

}  // namespace

TEST(Nvfp4Encode, RandomTensorsMatchTheFloat64ReferenceIncludingRaggedShapes) {
  torch::manual_seed(11);
  std::vector<std::vector<int64_t>> shapes = {{1}, {16}, {5}, {7, 37}, {64, 48}, {3, 5, 50}, {2, 9, 33}, {1, 1000}};
  for (const auto& shape : shapes) {
    for (double spread : {1.0, 1e-3, 1e4}) {
      torch::Tensor x = torch::randn(shape, torch::kFloat) * spread;
      // Heavy tails: some blocks much larger than the rest.
      x = x * torch::exp(torch::randn(shape) * 1.5);
      SCOPED_TRACE(::testing::Message() << "shape " << torch::IntArrayRef(shape) << " spread " << spread);
      nv::QTensor q = nv::quantize(x);
      nv::validate(q, "random");
      EXPECT_EQ(q.shape, shape);
      check_against_reference(x, q);
    }
  }
}

TEST(Nvfp4Encode, BFloat16AndHalfInputsKeepTheirDtypeTag) {
  // Seeded: libtorch seeds its default generator per process, and on a few unseeded draws (about 1 in 150) this small
  // tensor's 12 blocks hold 2 near-ties, past the reference check's statistical allowance.
  torch::manual_seed(12);
  torch::Tensor x = torch::randn({4, 40}).to(torch::kBFloat16);
  nv::QTensor q = nv::quantize(x);
  EXPECT_EQ(q.dtype, torch::kBFloat16);
  EXPECT_EQ(nv::dequantize(q).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(nv::dequantize(q, torch::kFloat).scalar_type(), torch::kFloat);
  check_against_reference(x.to(torch::kFloat), q);
  nv::QTensor h = nv::quantize(torch::randn({3, 16}).to(torch::kHalf));
  EXPECT_EQ(nv::dequantize(h).scalar_type(), torch::kHalf);
}

TEST(Nvfp4Encode, StackedExpertsGetOneTensorScalePerMatrix) {
  torch::manual_seed(13);  // as above: a fixed draw for the reference check's near-tie allowance
  torch::Tensor x = torch::randn({3, 4, 32});
  x[0] *= 1e-3;
  x[2] *= 50;
  nv::QTensor q = nv::quantize(x);
  ASSERT_EQ(q.matrices(), 3);
  ASSERT_EQ(q.rows(), 12);
  for (int m = 0; m < 3; ++m) {
    double amax = x[m].abs().max().item<double>();
    EXPECT_EQ(q.tensor_scale[m].item<float>(), ref::s_dec_of(amax)) << m;
    nv::QTensor qm = q.matrix(m);
    EXPECT_EQ(qm.shape, (std::vector<int64_t>{4, 32}));
    EXPECT_TRUE(torch::equal(nv::dequantize(qm), nv::dequantize(q)[m]));
  }
  check_against_reference(x, q);
  EXPECT_THROW(q.matrix(3), slm::Error);
}

TEST(Nvfp4Encode, ZeroTensorsAndZeroBlocks) {
  nv::QTensor z = nv::quantize(torch::zeros({3, 20}));
  EXPECT_EQ(z.tensor_scale.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(z.scales, torch::zeros_like(z.scales)));
  torch::Tensor dz = nv::dequantize(z);
  expect_all_finite(dz);
  EXPECT_TRUE(torch::equal(dz, torch::zeros({3, 20})));
  // A zero block next to non-zero ones.
  torch::Tensor x = torch::zeros({1, 48});
  x.index_put_({0, torch::indexing::Slice(16, 32)}, torch::linspace(-3, 3, 16));
  nv::QTensor q = nv::quantize(x);
  auto s = bytes_of(q.scales);
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(s[2], 0);
  EXPECT_EQ(s[1], 0x7E);
  torch::Tensor d = nv::dequantize(q);
  expect_all_finite(d);
  EXPECT_TRUE(torch::equal(d.index({0, torch::indexing::Slice(0, 16)}), torch::zeros({16})));
}

TEST(Nvfp4Encode, DenormalsHugeValuesAndMixturesStayFinite) {
  std::vector<torch::Tensor> cases = {
      torch::full({2, 16}, 1e-40f),                                // FP32 denormals only
      torch::tensor({1e-45f, -3e-42f, 7e-39f, 0.0f, 1e-38f}),      // denormals and the smallest normal
      torch::full({1, 16}, 1e30f),                                 // huge
      torch::tensor({1e30f, -1e30f, 3e38f, -3.4e38f, 1.0f, 1e-30f}),  // near FLT_MAX with tiny values
      torch::tensor({1e30f, 1e-40f, -1e-40f, 0.0f}),
      torch::tensor({FLT_MAX, -FLT_MAX, 1.0f}),
  };
  torch::Tensor mixed = torch::randn({4, 64}) * 1e-30;
  mixed[0][0] = 1e30f;  // every other block is negligible and flushes to zero
  cases.push_back(mixed);
  for (const auto& x : cases) {
    nv::QTensor q = nv::quantize(x);
    nv::validate(q, "edge");
    torch::Tensor d = nv::dequantize(q, torch::kFloat);
    expect_all_finite(d);
    expect_all_finite(q.tensor_scale);
    // Decoded values never exceed the input's magnitude range by more than the format's rounding.
    EXPECT_LE(d.abs().max().item<double>(), x.abs().max().item<double>() * (1 + 1.0 / 16) * 1.0001 + 1e-44) << x;
  }
  // Denormal-only tensors still decode to values of the right size, and huge tensors exactly at grid points.
  torch::Tensor den = torch::full({16}, 1e-40f);
  EXPECT_NEAR(nv::dequantize(nv::quantize(den))[0].item<double>(), 1e-40, 0.2e-40);
  torch::Tensor huge = torch::full({16}, 1e30f);
  EXPECT_NEAR(nv::dequantize(nv::quantize(huge))[0].item<double>(), 1e30, 1e24);
}

TEST(Nvfp4Encode, RejectsNonFiniteAndUnsupportedInputs) {
  auto expect_error = [](const torch::Tensor& t, const std::string& fragment) {
    try {
      nv::quantize(t, {}, "layers.0.w");
      ADD_FAILURE() << "expected an error";
    } catch (const slm::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("layers.0.w"), std::string::npos) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    }
  };
  expect_error(torch::tensor({1.0f, NAN}), "flat index 1");
  expect_error(torch::tensor({INFINITY, 1.0f}), "flat index 0");
  expect_error(torch::zeros({3}, torch::kInt), "floating");
  expect_error(torch::tensor(1.0f), "0-d");
  expect_error(torch::zeros({0, 4}), "zero-sized");
}

TEST(Nvfp4Encode, StochasticRoundingIsUnbiasedAndSeeded) {
  // Row of [6, v, v, ...]: the element scale is ~1, so v = 2.25 lands between codes 2 and 3 (values 2 and 3).
  const int rows = 512;
  torch::Tensor x = torch::full({rows, 16}, 2.25f);
  x.index_put_({torch::indexing::Slice(), 0}, 6.0f);
  nv::EncodeOptions sr{nv::Rounding::Stochastic, 1234};
  nv::QTensor a = nv::quantize(x, sr), b = nv::quantize(x, sr), c = nv::quantize(x, {nv::Rounding::Stochastic, 99});
  EXPECT_TRUE(torch::equal(a.codes, b.codes));
  EXPECT_FALSE(torch::equal(a.codes, c.codes));
  torch::Tensor d = nv::dequantize(a).index({torch::indexing::Slice(), torch::indexing::Slice(1, 16)});
  auto vals = std::get<0>(at::_unique(d.flatten()));
  EXPECT_EQ(vals.numel(), 2) << vals;
  double mean = d.mean().item<double>();
  // Bernoulli(1/4) over 7680 samples: standard error of the mean 0.005; allow 5 sigma.
  EXPECT_NEAR(mean, 2.25, 0.025);
  // Nearest rounding of the same tensor is biased to 2.
  EXPECT_NEAR(nv::dequantize(nv::quantize(x)).index({0, 1}).item<double>(), 2.0, 1e-5);
}

TEST(Nvfp4Layout, StorageBytesAgreeWithAccounting) {
  for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{{64, 48}, {7, 37}, {3, 5, 50}, {100}}) {
    nv::QTensor q = nv::quantize(torch::randn(shape));
    slm::ParamSpec p;
    p.name = "w";
    p.kind = shape.size() == 3 ? slm::ParamKind::Expert : slm::ParamKind::Linear;
    p.shape.assign(shape.begin(), shape.end());
    EXPECT_EQ(q.storage_bytes(), slm::nvfp4_bytes(p));
    EXPECT_EQ(q.codes.numel() + q.scales.numel() + 4 * q.tensor_scale.numel(), q.storage_bytes());
  }
}

TEST(Nvfp4Layout, PackingPutsEvenElementsInTheLowNibbleAndPadsWithZero) {
  torch::Tensor codes = torch::tensor({1, 2, 3, 4, 5, 15, 8, 7, 9}, torch::kUInt8).reshape({1, 9});
  torch::Tensor packed = nv::pack_codes(codes);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{1, 8}));
  std::vector<uint8_t> want = {0x21, 0x43, 0xF5, 0x78, 0x09, 0, 0, 0};
  EXPECT_EQ(bytes_of(packed), want);
  EXPECT_THROW(nv::pack_codes(torch::tensor({16}, torch::kUInt8).reshape({1, 1})), slm::Error);
}

TEST(Nvfp4Layout, ValidateRejectsInconsistentBuffers) {
  nv::QTensor q = nv::quantize(torch::randn({4, 40}));
  auto expect_bad = [](nv::QTensor bad, const std::string& fragment) {
    try {
      nv::validate(bad, "w");
      ADD_FAILURE() << "expected an error";
    } catch (const slm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  nv::QTensor b = q;
  b.scales = q.scales.narrow(1, 0, 2).contiguous();
  expect_bad(b, "block scales has shape [4, 2], expected [4, 3]");
  b = q;
  b.shape = {4, 50};
  expect_bad(b, "codes has shape");
  b = q;
  b.tensor_scale = torch::tensor({NAN});
  expect_bad(b, "tensor scale 0");
  b = q;
  b.scales = q.scales.clone();
  b.scales[1][1] = 0x7F;
  expect_bad(b, "NaN");
  b = q;
  b.codes = q.codes.to(torch::kInt);
  expect_bad(b, "dtype");
}

// block_values against the float64 field definitions of every code and scale byte (padding included), exact in
// BF16, and dequantize = block_values * s_dec bit for bit; stacked experts use their own matrix's tensor scale.
TEST(Nvfp4Layout, BlockValuesAreExactProductsOfCodesAndBlockScales) {
  torch::manual_seed(31);
  for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{{9, 37}, {3, 4, 50}, {21}, {2, 256}}) {
    SCOPED_TRACE(::testing::Message() << "shape rank " << shape.size() << " K " << shape.back());
    torch::Tensor x = torch::randn(shape) * torch::exp(2 * torch::randn(shape));
    nv::QTensor q = nv::quantize(x);
    const int64_t rows = q.rows(), kp = q.k_padded(), K = q.k(), blocks = q.blocks_per_row();
    torch::Tensor v = nv::block_values(q);
    ASSERT_EQ(v.sizes(), (std::vector<int64_t>{rows, kp}));
    ASSERT_EQ(v.scalar_type(), torch::kFloat);
    auto codes = bytes_of(q.codes), scales = bytes_of(q.scales);
    auto va = v.accessor<float, 2>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < kp; ++k) {
        const uint8_t byte = codes[r * kp / 2 + k / 2];
        const double want =
            ref::e2m1_value((k & 1) ? byte >> 4 : byte & 15) * ref::e4m3_value(scales[r * blocks + k / 16]);
        ASSERT_EQ(static_cast<double>(va[r][k]), want) << "row " << r << " element " << k;
        if (k >= K) {
          ASSERT_EQ(va[r][k], 0.0f) << "padding";
        }
      }
    EXPECT_TRUE(torch::equal(v.to(torch::kBFloat16).to(torch::kFloat), v));
    const int64_t rpm = q.rows_per_matrix();
    torch::Tensor d = nv::dequantize(q, torch::kFloat).reshape({rows, K});
    auto da = d.accessor<float, 2>();
    const float* tsp = q.tensor_scale.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(da[r][k], va[r][k] * tsp[r / rpm]) << "row " << r << " element " << k;
  }
}
