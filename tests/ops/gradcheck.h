#pragma once
// Float64 gradient check in the style of torch.autograd.gradcheck(fast_mode=True): the autograd gradient,
// projected on random directions, against central finite differences of the same scalar function.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <vector>

namespace slm::test {

// loss() recomputes a float64 scalar from the current values of leaves (which require grad).
inline void expect_gradcheck(const std::function<torch::Tensor()>& loss, const std::vector<torch::Tensor>& leaves,
                             int directions = 3, double step = 1e-6, double tol = 1e-6) {
  auto grads = torch::autograd::grad({loss()}, leaves, {}, false, false, true);
  for (int d = 0; d < directions; ++d) {
    std::vector<torch::Tensor> dirs;
    double analytic = 0;
    for (size_t i = 0; i < leaves.size(); ++i) {
      dirs.push_back(torch::randn_like(leaves[i]));
      if (grads[i].defined()) analytic += (grads[i] * dirs[i]).sum().item<double>();
    }
    auto shifted = [&](double s) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < leaves.size(); ++i) leaves[i].add_(dirs[i], s);
      double v = loss().item<double>();
      for (size_t i = 0; i < leaves.size(); ++i) leaves[i].sub_(dirs[i], s);
      return v;
    };
    const double numeric = (shifted(step) - shifted(-step)) / (2 * step);
    EXPECT_NEAR(analytic, numeric, tol * std::max(1.0, std::abs(numeric))) << "direction " << d;
  }
}

}  // namespace slm::test
