#pragma once
// The benchmarks' random weights: N(0, 1/fan_in) for every matrix (a fresh model's zero output projections would
// make some layers free), seed 1, so every run and every benchmark times the same model.
#include <torch/torch.h>

#include <cmath>

#include "slm/model/hybrid_lm.h"

namespace slm::bench {

inline void randomize(model::HybridLM& m) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  for (auto& p : m.parameters())
    if (p.dim() >= 2) p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(-1))));
}

}  // namespace slm::bench
