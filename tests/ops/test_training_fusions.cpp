// Training's fused CUDA kernels against float64 references: the SwiGLU activation and Mamba-3's output gate
// (ops/swiglu.h), and the residual mix with the next layer's pre-norm (ops::residual_mix_norm). Each runs only on a
// CUDA device; the CPU build keeps the tensor ops.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "slm/ops/residual_mix.h"
#include "slm/ops/swiglu.h"
#include "test_util.h"

using namespace slm;

namespace {

torch::Tensor f64(const torch::Tensor& t) {
  return t.detach().cpu().to(torch::kDouble);
}

// max |got - want| / max |want|, in float64 on the host.
double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto w = f64(want);
  return (f64(got) - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-30);
}

// BF16 autocast on the GPU for the scope, as the trainer runs its forward.
struct Bf16Autocast {
  Bf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  ~Bf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
};

}  // namespace

// Forward: the tensor ops' values bit for bit (silu rounded to the dtype before the product, as at::silu returns it).
// Backward: float64 gradients of silu(gate) * up within the dtype's rounding. Hidden widths with the 16-byte vector
// path (88, 1024) and without it (45).
TEST(TrainingFusionsCuda, SwiGLUEqualsTheTensorOpsAndFloat64Gradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(3);
  for (auto dt : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    for (int64_t hidden : {88, 45, 1024}) {
      const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      const auto h = (2 * torch::randn({3, 37, 2 * hidden})).to(o);
      const auto parts = h.chunk(2, -1);
      const auto tensor_ops = at::silu(parts[0]) * parts[1];
      {
        torch::NoGradGuard no_grad;
        EXPECT_TRUE(torch::equal(ops::swiglu(h), tensor_ops)) << dt << " " << hidden;
      }
      const auto hg = h.clone().requires_grad_(true);
      const auto out = ops::swiglu(hg);
      ASSERT_NE(out.grad_fn()->name().find("FusedSwiGLU"), std::string::npos) << out.grad_fn()->name();
      EXPECT_TRUE(torch::equal(out, tensor_ops)) << dt << " " << hidden;
      const auto up = torch::randn(out.sizes()).to(o);
      const auto got = torch::autograd::grad({out}, {hg}, {up})[0];
      ASSERT_EQ(got.scalar_type(), dt);

      const auto hd = f64(h).requires_grad_(true);
      const auto pd = hd.chunk(2, -1);
      const auto want = torch::autograd::grad({pd[0] * torch::sigmoid(pd[0]) * pd[1]}, {hd}, {f64(up)})[0];
      // One rounding of each gradient to the dtype (and the rounded silu in d up): ~2^-8 relative for BF16.
      const double tol = dt == torch::kBFloat16 ? 1e-2 : dt == torch::kHalf ? 2e-3 : 2e-6;
      EXPECT_LT(relative_error(got.narrow(-1, 0, hidden), want.narrow(-1, 0, hidden)), tol)
          << "d gate " << dt << " " << hidden;
      EXPECT_LT(relative_error(got.narrow(-1, hidden, hidden), want.narrow(-1, hidden, hidden)), tol)
          << "d up " << dt << " " << hidden;
    }
  }
}

// The mix r (x + y) + b x0 and h = rms_norm(mix) * w in one kernel each way. The stream equals the tensor ops' mix bit
// for bit; h and every gradient (x, y, x0, both lambdas, w) match a float64 evaluation of the same formula, with the
// upstream gradients of both outputs, of h alone (the stream's gradient undefined), in BF16 under autocast and in
// FP32 without it. Widths: 96 (a partial first lane group), 1024 and 1536 (the three register layouts); 111 rows.
TEST(TrainingFusionsCuda, ResidualMixNormMatchesFloat64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(11);
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat);
  const double eps = 1e-6;
  for (bool autocast : {true, false}) {
    for (int64_t d : {96, 1024, 1536}) {
      for (bool with_y : {true, false}) {
        for (bool both : {true, false}) {
          const auto h_dtype = autocast ? torch::kBFloat16 : torch::kFloat;
          const int64_t b = 3, t = 37;
          const auto x = torch::randn({b, t, d}, f32).requires_grad_(true);
          const auto x0 = torch::randn({b, t, d}, f32).requires_grad_(true);
          const auto y = with_y ? torch::randn({b, t, d}, f32).to(h_dtype).requires_grad_(true) : torch::Tensor();
          const auto lambdas = torch::tensor({1.13, 0.17}, f32).requires_grad_(true);
          const auto w = (1 + 0.3 * torch::randn({d}, f32)).requires_grad_(true);
          std::pair<torch::Tensor, torch::Tensor> got;
          {
            std::optional<Bf16Autocast> scope;
            if (autocast) scope.emplace();
            got = ops::residual_mix_norm(x, y, lambdas[0], x0, lambdas[1], w, eps);
          }
          const auto& [out, h] = got;
          const std::string where = std::string(autocast ? "bf16 " : "fp32 ") + std::to_string(d) +
                                    (with_y ? " y" : " no y") + (both ? " both" : " h only");
          ASSERT_NE(h.grad_fn()->name().find("FusedResidualMixNorm"), std::string::npos) << h.grad_fn()->name();
          ASSERT_EQ(h.scalar_type(), h_dtype) << where;
          ASSERT_EQ(out.scalar_type(), torch::kFloat) << where;
          const auto mix = with_y ? lambdas[0] * (x + y) + lambdas[1] * x0 : lambdas[0] * x + lambdas[1] * x0;
          EXPECT_TRUE(torch::equal(out, mix)) << where;

          std::vector<torch::Tensor> inputs = {x, x0, lambdas, w};
          if (with_y) inputs.push_back(y);
          const auto gout = torch::randn({b, t, d}, f32), gh = torch::randn({b, t, d}, f32).to(h_dtype);
          const auto grads =
              both ? torch::autograd::grad({out, h}, inputs, {gout, gh}) : torch::autograd::grad({h}, inputs, {gh});

          std::vector<torch::Tensor> in64;
          for (const auto& v : inputs) in64.push_back(f64(v).requires_grad_(true));
          const auto &xd = in64[0], &x0d = in64[1], &ld = in64[2], &wd = in64[3];
          const auto sd = with_y ? xd + in64[4] : xd;
          const auto outd = ld[0] * sd + ld[1] * x0d;
          const auto hd = outd * torch::rsqrt(outd.pow(2).mean(-1, true) + eps) * wd;
          const auto want = both ? torch::autograd::grad({outd, hd}, in64, {f64(gout), f64(gh)})
                                 : torch::autograd::grad({hd}, in64, {f64(gh)});

          // h: FP32 arithmetic then one rounding to its dtype.
          EXPECT_LT(relative_error(h, hd), autocast ? 8e-3 : 2e-6) << "h " << where;
          // FP32 gradients of unit-scale inputs: the norm's backward sums d products per row, FP32 relative error.
          EXPECT_LT(relative_error(grads[0], want[0]), 2e-5) << "dx " << where;
          EXPECT_LT(relative_error(grads[1], want[1]), 2e-5) << "dx0 " << where;
          EXPECT_LT(relative_error(grads[3], want[3]), 2e-5) << "dw " << where;
          if (with_y) {
            EXPECT_LT(relative_error(grads[4], want[4]), autocast ? 8e-3 : 2e-5) << "dy " << where;
          }
          // The lambdas' gradients: sums over all b t d elements of unit-scale products.
          const auto dl = f64(grads[2]), wl = f64(want[2]);
          const double tol = 1e-4 * std::sqrt(static_cast<double>(b * t * d)) * 4;
          EXPECT_NEAR(dl[0].item<double>(), wl[0].item<double>(), tol) << "dr " << where;
          EXPECT_NEAR(dl[1].item<double>(), wl[1].item<double>(), tol) << "db " << where;
        }
      }
    }
  }
}

// Mamba-3's SISO output gate y * silu(z) from the scan's FP32 output and a slice of the input projection: the tensor
// ops' values bit for bit (ops::mamba3_gate without MIMO or norm, cast to z's dtype), float64 gradients for y and z.
TEST(TrainingFusionsCuda, SiluGateEqualsTheTensorOpsAndFloat64Gradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(5);
  for (auto dt : {torch::kBFloat16, torch::kFloat}) {
    for (int64_t t : {29, 1}) {
      const int64_t b = 2, h = 3, p = 16;
      const auto o = torch::TensorOptions().device(torch::kCUDA).dtype(dt);
      // z: the first h * p columns of a wider projection, as Mamba3Impl splits it.
      const auto proj = (2 * torch::randn({b, t, h * p + 40})).to(o);
      const auto z = proj.narrow(-1, 0, h * p).view({b, t, h, p});
      const auto y = torch::randn({b, t, h, 1, p}, o.dtype(torch::kFloat));
      ASSERT_TRUE(ops::silu_gate_fusable(y, z)) << dt << " " << t;
      const auto tensor_ops = (y * at::silu(z.to(torch::kFloat).unsqueeze(3))).sum(3).flatten(2).to(dt);
      const auto yg = y.clone().requires_grad_(true);
      // The strided form: z a view into a wider tensor that takes the gradient.
      const auto wide = torch::zeros_like(proj).requires_grad_(true);
      const auto zview = (wide + proj).narrow(-1, 0, h * p).view({b, t, h, p});
      const auto out = ops::silu_gate(yg, zview);
      ASSERT_NE(out.grad_fn()->name().find("FusedSiluGate"), std::string::npos) << out.grad_fn()->name();
      EXPECT_TRUE(torch::equal(out, tensor_ops)) << dt << " " << t;
      const auto up = torch::randn(out.sizes()).to(o);
      const auto got = torch::autograd::grad({out}, {yg, wide}, {up});
      const auto yd = f64(y).requires_grad_(true), zd = f64(z).requires_grad_(true);
      const auto want_out = (yd * (zd * torch::sigmoid(zd)).unsqueeze(3)).sum(3).flatten(2);
      const auto want = torch::autograd::grad({want_out}, {yd, zd}, {f64(up)});
      EXPECT_LT(relative_error(got[0], want[0]), dt == torch::kFloat ? 2e-6 : 8e-3) << "dy " << dt << " " << t;
      EXPECT_LT(relative_error(got[1].narrow(-1, 0, h * p).view({b, t, h, p}), want[1]),
                dt == torch::kFloat ? 2e-6 : 1e-2)
          << "dz " << dt << " " << t;
      // The columns past z take no gradient.
      EXPECT_EQ(got[1].narrow(-1, h * p, 40).abs().max().item<double>(), 0.0) << dt << " " << t;
    }
  }
}
