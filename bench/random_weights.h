#pragma once
// The benchmarks' random weights: N(0, 1/fan_in) for every matrix (a fresh model's zero output projections would
// make some layers free), seed 1, so every run and every benchmark times the same model.
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <memory>
#include <string>

#include "slm/model/hybrid_lm.h"
#include "slm/model/weights.h"
#include "slm/quant/quantize_checkpoint.h"

namespace slm::bench {

inline void randomize(model::HybridLM& m) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  for (auto& p : m.parameters())
    if (p.dim() >= 2) p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(-1))));
}

// A random model of recipe in eval mode, its parameters of dtype on device. NVFP4: built in FP32 on the CPU, saved,
// quantized by `slm quantize`'s code (nvfp4::quantize_checkpoint, through a temporary file: there is no in-memory
// quantizer; quantize_head as --quantize-head) and loaded, so every quantizable matrix runs nvfp4::linear.
inline std::unique_ptr<model::HybridLM> random_model(const Recipe& recipe, torch::ScalarType dtype,
                                                     const torch::Device& device, bool nvfp4 = false,
                                                     bool quantize_head = false) {
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  auto m = std::make_unique<model::HybridLM>(recipe, options);
  if (!nvfp4) {
    randomize(*m);
  } else {
    const std::string stem = "/tmp/slm_bench_" + std::to_string(getpid());
    {
      model::HybridLM dense(recipe);
      randomize(dense);
      model::save_weights(dense, stem + "_dense.safetensors");
    }
    nvfp4::quantize_checkpoint(stem + "_dense.safetensors", stem + "_nvfp4.safetensors", recipe, {}, quantize_head);
    ::unlink((stem + "_dense.safetensors").c_str());
    model::load_weights(*m, stem + "_nvfp4.safetensors");
    ::unlink((stem + "_nvfp4.safetensors").c_str());
  }
  m->eval();
  return m;
}

}  // namespace slm::bench
