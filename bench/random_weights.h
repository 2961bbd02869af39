#pragma once
// The benchmarks' random weights: N(0, 1/fan_in) for every matrix (a fresh model's zero output projections would
// make some layers free), seed 1, so every run and every benchmark times the same model.
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "slm/model/hybrid_lm.h"
#include "slm/model/weights.h"
#include "slm/quant/nvfp4.h"
#include "slm/recipe/accounting.h"

namespace slm::bench {

inline void randomize(model::HybridLM& m) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  for (auto& p : m.parameters())
    if (p.dim() >= 2) p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(-1))));
}

// A weight of `shape` in NVFP4 with random codes on device: every nibble uniform over the 16 E2M1 codes (the padding
// past K zero), block scales 1, and the tensor scale that gives the N(0, 1/fan_in) spread (the codes' RMS is 2.93).
inline nvfp4::QTensor random_nvfp4(const std::vector<int64_t>& shape, torch::ScalarType dtype,
                                   const torch::Device& device) {
  nvfp4::QTensor q;
  q.shape = shape;
  q.dtype = dtype;
  const int64_t k = q.k(), rows = q.rows(), kp = q.k_padded();
  const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).device(device);
  q.codes = torch::randint(0, 256, {rows, kp / 2}, bytes);
  if (k < kp) {
    q.codes.narrow(1, (k + 1) / 2, kp / 2 - (k + 1) / 2).zero_();
    if (k % 2) q.codes.narrow(1, k / 2, 1).bitwise_and_(0x0F);
  }
  q.scales = torch::full({rows, kp / nvfp4::kBlock}, static_cast<int64_t>(nvfp4::e4m3_encode_rne(1.0f)), bytes);
  q.tensor_scale = torch::full({q.matrices()}, 1.0 / (2.93 * std::sqrt(static_cast<double>(k))),
                               torch::TensorOptions().dtype(torch::kFloat).device(device));
  return q;
}

// A random model of recipe in eval mode, its parameters of dtype on device. NVFP4: the matrices `slm quantize`
// quantizes (the accounting's quantizable linear and expert weights; the LM head with quantize_head) run NVFP4 with
// random codes (random_nvfp4), installed in memory by model::use_nvfp4_weights. Speed and memory do not depend on the
// values, and quantizing a 6B model on the CPU through a checkpoint took 5.5 minutes of a GPU session.
inline std::unique_ptr<model::HybridLM> random_model(const Recipe& recipe, torch::ScalarType dtype,
                                                     const torch::Device& device, bool nvfp4 = false,
                                                     bool quantize_head = false) {
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  auto m = std::make_unique<model::HybridLM>(recipe, options);
  randomize(*m);
  if (nvfp4) {
    std::set<std::string> wanted;
    for (const auto& p : account(recipe, m->plan()).params)
      if (p.quantized() || (quantize_head && p.kind == ParamKind::Head)) wanted.insert(p.name);
    const auto state = model::named_state(*m);
    std::map<std::string, nvfp4::QTensor> matrices;
    torch::manual_seed(2);
    for (const auto& name : model::nvfp4_weight_slots(*m))
      if (wanted.count(name)) matrices.emplace(name, random_nvfp4(state.at(name).sizes().vec(), dtype, device));
    model::use_nvfp4_weights(*m, std::move(matrices));
  }
  m->eval();
  return m;
}

}  // namespace slm::bench
