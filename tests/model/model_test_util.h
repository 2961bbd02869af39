#pragma once
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>

#include "slm/model/hybrid_lm.h"
#include "test_util.h"

namespace slm::test {

// ctest runs two test processes on two cores; intra-op threads on tiny tensors then only contend
// (measured: 2.4 ms per micro-model loss single-threaded, 110 ms with two threads each).
inline void single_threaded() { torch::set_num_threads(1); }

inline Recipe tiny_ae() { return load_recipe(source_path("recipes/tiny-ae.json")); }

// A model small enough for float64 finite differences: A and E layers, a short window, an MTP module.
inline nlohmann::json micro_ae_json() {
  return nlohmann::json::parse(R"({
    "name": "micro", "vocab_size": 13, "d_model": 8, "depth": 3, "pattern": "AEA", "seq_len": 16,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 4, "window_pattern": "SL", "short_window": 3},
    "moe": {"routed_experts": 4, "experts_per_token": 2, "expert_hidden": 4, "routed_scaling_factor": 1.5,
            "aux_loss_weight": 0.01},
    "mlp": {"hidden": 6},
    "mtp": {"depth": 2, "pattern": "AE"}
  })");
}

// Every cache kind a speculative decoder rolls back, at toy width: attention with a binding window, Mamba-3, M2RNN,
// MoE, a dense MLP, Engram on layer 4 (attention), and two MTP modules whose layers are attention and Mamba-3 (so
// the MTP caches hold both kinds).
inline nlohmann::json spec_hybrid_json() {
  return nlohmann::json::parse(R"({
    "name": "spec-hybrid", "vocab_size": 29, "d_model": 16, "depth": 6, "pattern": "AMERAF", "seq_len": 64,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 8, "window_pattern": "SL", "short_window": 6},
    "mamba3": {"d_state": 8, "expand": 2, "headdim": 8, "ngroups": 1, "is_mimo": false, "chunk_size": 4},
    "m2rnn": {"heads": 2, "k_head_dim": 8, "v_head_dim": 4},
    "moe": {"routed_experts": 4, "experts_per_token": 2, "shared_experts": 1, "expert_hidden": 8},
    "mlp": {"hidden": 24},
    "engram": {"enabled": true, "layers": [4], "orders": "2,3", "heads_per_order": 2, "table_rows": 31,
               "embed_dim": 4, "conv_kernel": 4},
    "mtp": {"depth": 2, "pattern": "AM"}
  })");
}

// Fresh models start with zero output projections and a near-zero head, which would make comparisons
// trivial; tests overwrite every parameter with noise of unit-ish scale.
inline void randomize(model::HybridLM& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : m.named_parameters()) {
    auto& t = p.value();
    if (t.dim() >= 2) t.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(t.size(-1))));
    else if (p.key().find("lambdas") != std::string::npos) t.uniform_(0.5, 1.0);
    else t.normal_(1.0, 0.1);
  }
}

// A randomized model of recipe j in eval mode, with parameters of dtype.
inline std::unique_ptr<model::HybridLM> random_model(const nlohmann::json& j, uint64_t seed,
                                                     torch::ScalarType dtype = torch::kFloat) {
  auto m = std::make_unique<model::HybridLM>(parse(j), torch::TensorOptions().dtype(dtype));
  randomize(*m, seed);
  m->eval();
  return m;
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

inline torch::Tensor random_tokens(int64_t batch, int64_t len, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(vocab, {batch, len}, gen, torch::kLong);
}

}  // namespace slm::test
