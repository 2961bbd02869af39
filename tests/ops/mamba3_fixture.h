#pragma once
// Random Mamba-3 projections, weights and states for the scan tests.
#include <torch/torch.h>

#include <vector>

#include "slm/ops/mamba3_scan.h"

namespace slm::test {

struct Mamba3Case {
  int64_t batch, tokens, heads, headdim, d_state, rank, groups, angles;
};

struct Mamba3Inputs {
  ops::Mamba3Projections proj;
  ops::Mamba3Weights weights;
  ops::Mamba3State state;
  // Every tensor above, for gradient checks.
  std::vector<torch::Tensor> leaves() const {
    std::vector<torch::Tensor> v = {proj.x,         proj.b,         proj.c,         proj.dd_dt,    proj.dd_a,
                                    proj.trap,      proj.angle,     weights.dt_bias, weights.b_bias, weights.c_bias,
                                    weights.b_norm, weights.c_norm, weights.d,       state.angle,    state.ssm,
                                    state.k,        state.x};
    if (weights.mimo_x.defined()) v.push_back(weights.mimo_x);
    return v;
  }
};

// Values in the ranges a trained layer sees: Δ around 0.01-1, λ anywhere in (0, 1), phases of several rad.
// fresh_state: zero state (start of a sequence); otherwise a random mid-sequence state.
inline Mamba3Inputs random_mamba3(const Mamba3Case& c, torch::Dtype dtype, bool fresh_state = false,
                                  bool requires_grad = false) {
  auto o = torch::TensorOptions().dtype(dtype);
  auto rnd = [&](std::vector<int64_t> shape, double scale = 1.0, double shift = 0.0) {
    return (torch::randn(shape, o) * scale + shift).set_requires_grad(requires_grad);
  };
  const int64_t B = c.batch, T = c.tokens, H = c.heads, P = c.headdim, N = c.d_state, R = c.rank, G = c.groups,
                S = c.angles;
  Mamba3Inputs in;
  in.proj = {rnd({B, T, H, P}), rnd({B, T, R, G, N}), rnd({B, T, R, G, N}), rnd({B, T, H}), rnd({B, T, H}),
             rnd({B, T, H}, 2.0), rnd({B, T, S})};
  in.weights.dt_bias = rnd({H}, 0.5, -2.0);
  in.weights.b_bias = rnd({H, R, N}, 0.3, 1.0);
  in.weights.c_bias = rnd({H, R, N}, 0.3, 1.0);
  in.weights.b_norm = rnd({N}, 0.2, 1.0);
  in.weights.c_norm = rnd({N}, 0.2, 1.0);
  in.weights.d = rnd({H}, 0.5, 1.0);
  if (R > 1) in.weights.mimo_x = rnd({H, R, P}, 0.3, 1.0 / R);
  if (fresh_state) {
    in.state = ops::mamba3_zero_state(B, H, P, N, R, S, o);
  } else {
    in.state = {(torch::rand({B, H, S}, o) * 6.0).set_requires_grad(requires_grad), rnd({B, H, P, N}, 0.5),
                rnd({B, H, R, N}), rnd({B, H, P})};
  }
  return in;
}

// Tokens [from, from + len) of a projection set.
inline ops::Mamba3Projections slice(const ops::Mamba3Projections& p, int64_t from, int64_t len) {
  auto s = [&](const torch::Tensor& t) { return t.narrow(1, from, len); };
  return {s(p.x), s(p.b), s(p.c), s(p.dd_dt), s(p.dd_a), s(p.trap), s(p.angle)};
}

// max |a - b| / max |b|: relative to the scale of the reference, so tiny entries do not dominate.
inline double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  auto ref = b.detach().to(torch::kDouble);
  double scale = ref.abs().max().item<double>();
  return (a.detach().to(torch::kDouble) - ref).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

}  // namespace slm::test
