#include "slm/model/features/mhc.h"

#include <torch/torch.h>

#include <cmath>

#include "slm/ops/rms_norm.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/sinkhorn_kernel.h"
#endif

namespace slm::model {

namespace {

// The paper's α init (App. A).
constexpr double kAlphaInit = 0.01;

double logit(double p) {
  return std::log(p / (1.0 - p));
}

torch::Tensor normalized_flat(const torch::Tensor& streams, double eps) {
  auto flat = streams.flatten(-2);
  return ops::rms_norm(flat, std::nullopt, eps);
}

torch::Tensor blend_with(const torch::Tensor& learned, const torch::Tensor& plain, double beta) {
  return beta == 1.0 ? learned : plain + beta * (learned - plain);
}

}  // namespace

torch::Tensor sinkhorn(const torch::Tensor& logits, int iters, double eps) {
  auto z = logits.to(at::promote_types(logits.scalar_type(), torch::kFloat));
#ifdef SLM_WITH_CUDA
  // Inference on the GPU: the fused kernel (ops/cuda/sinkhorn_kernel.cu) instead of ~4 launches per round.
  const int64_t n = z.dim() >= 2 ? z.size(-1) : 0;
  if (z.is_cuda() && z.scalar_type() == torch::kFloat && !(torch::GradMode::is_enabled() && z.requires_grad()) &&
      n >= 1 && n <= ops::cuda::kSinkhornMaxStreams && z.size(-2) == n) {
    const c10::cuda::CUDAGuard guard(z.device());
    const auto in = z.contiguous();
    auto out = torch::empty_like(in);
    const std::string error =
        ops::cuda::sinkhorn(in.data_ptr<float>(), out.data_ptr<float>(), in.numel() / (n * n), static_cast<int>(n),
                            iters, static_cast<float>(eps), at::cuda::getCurrentCUDAStream().stream());
    if (!error.empty()) throw Error("mHC: " + error);
    return out;
  }
#endif
  auto m = torch::exp(z - std::get<0>(z.flatten(-2).max(-1, true)).unsqueeze(-1));
  // Columns first, rows last (the paper's T_r(T_c(M))): after a finite number of rounds the last normalisation
  // is the exact one, and exact rows make every output stream a convex combination of the input streams, so
  // no product of H_res can amplify the streams; the columns (each input's total weight) carry what is left.
  for (int i = 0; i < iters; ++i) {
    m = m / (m.sum(-2, true) + eps);
    m = m / (m.sum(-1, true) + eps);
  }
  return m;
}

torch::Tensor mhc_read(const torch::Tensor& streams, const torch::Tensor& pre) {
  return (pre.to(streams.scalar_type()).unsqueeze(-1) * streams).sum(-2);
}

torch::Tensor mhc_write(const torch::Tensor& streams, const torch::Tensor& y, const MhcCoefficients& c) {
  const auto dt = streams.scalar_type();
  return c.post.to(dt).unsqueeze(-1) * y.unsqueeze(-2) + torch::matmul(c.res.to(dt), streams);
}

MhcMixImpl::MhcMixImpl(const Recipe& r, int layer, const torch::TensorOptions& options)
    : n(r.mhc.streams),
      iters(r.mhc.sinkhorn_iters),
      temperature(r.mhc.temperature),
      epsilon(r.mhc.epsilon),
      blend(r.mhc.blend_alpha),
      norm_eps(r.norm_eps) {
  const int64_t width = n * n + 2 * n;
  phi = register_parameter("phi", torch::zeros({width, n * r.d_model}, options));
  bias = register_parameter("bias", torch::zeros({width}, options));
  alpha = register_parameter("alpha", torch::full({3}, kAlphaInit, options));
  if (options.device().is_meta()) return;
  torch::NoGradGuard no_grad;
  // H_pre: (n+1)/(2n) on stream layer mod n, 1/(2n) on the others (sums to 1).
  for (int64_t i = 0; i < n; ++i) bias[i] = logit(i == layer % n ? (n + 1.0) / (2.0 * n) : 1.0 / (2.0 * n));
  // H_post = 2σ(0) = 1. H_res logits 0: the uniform matrix J/n, the centre of the doubly stochastic set. A
  // near-identity start (logits c·I, c ≈ 4) is a near-permutation, where Sinkhorn converges slowly: after the
  // default 20 iterations its columns miss 1 by ~2e-4 once the logits move by 0.01, while from the centre they
  // stay within 1e-5 for logit spreads up to ~0.1 (test_mhc measures both).
}

MhcCoefficients MhcMixImpl::coefficients(const torch::Tensor& streams) const {
  if (streams.dim() < 2 || streams.size(-2) != n || streams.size(-1) * n != phi.size(1))
    throw Error("mHC: expected streams [..., " + std::to_string(n) + ", " + std::to_string(phi.size(1) / n) + "]");
  auto h = at::linear(normalized_flat(streams, norm_eps), phi);  // [..., n²+2n]
  auto parts = h.split_with_sizes({n, n, n * n}, -1);
  auto b = bias.split_with_sizes({n, n, n * n}, -1);
  MhcCoefficients c;
  c.pre = torch::sigmoid(alpha[0] * parts[0] + b[0]);
  c.post = 2.0 * torch::sigmoid(alpha[1] * parts[1] + b[1]);
  auto res_logits = (alpha[2] * parts[2] + b[2]) / temperature;
  auto shape = res_logits.sizes().vec();
  shape.back() = n;
  shape.push_back(n);
  c.res = sinkhorn(res_logits.view(shape), iters, epsilon);
  if (blend != 1.0) {
    c.pre = blend_with(c.pre, torch::full_like(c.pre, 1.0 / static_cast<double>(n)), blend);
    c.post = blend_with(c.post, torch::ones_like(c.post), blend);
    c.res = blend_with(c.res, torch::eye(n, c.res.options()).expand_as(c.res), blend);
  }
  return c;
}

MhcHeadImpl::MhcHeadImpl(const Recipe& r, const torch::TensorOptions& options)
    : n(r.mhc.streams), blend(r.mhc.blend_alpha), norm_eps(r.norm_eps) {
  phi = register_parameter("phi", torch::zeros({n, n * r.d_model}, options));
  bias = register_parameter("bias", torch::full({n}, logit(1.0 / static_cast<double>(n)), options));
  alpha = register_parameter("alpha", torch::full({1}, kAlphaInit, options));
}

torch::Tensor MhcHeadImpl::forward(const torch::Tensor& streams) const {
  auto pre = torch::sigmoid(alpha * at::linear(normalized_flat(streams, norm_eps), phi) + bias);
  pre = blend_with(pre, torch::full_like(pre, 1.0 / static_cast<double>(n)), blend);
  return mhc_read(streams, pre);
}

}  // namespace slm::model
