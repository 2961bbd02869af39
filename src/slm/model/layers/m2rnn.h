#pragma once
// R: an M2RNN mixer layer (matrix-state non-linear RNN), Mishra et al., "M²RNN", arXiv 2603.14360:
//   [q k v | f | g] = in_proj(h);  q, k, v <- silu(depthwise causal conv);  f = exp(-exp(A_log)·softplus(f + dt_bias))
//   y = M2RNN(q, k, v, f; W) + D ⊙ v;  out = out_proj(RMSNorm(y ⊙ silu(g)))
// The qk_heads query/key heads are shared by the state heads (head n reads qk head n / (heads / qk_heads)).
#include <array>
#include <utility>

#include "slm/model/layer.h"
#include "slm/model/layers/recurrent_cache.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

struct M2RNNState {
  torch::Tensor conv;  // [B, conv channels, kernel - 1] the last conv inputs
  torch::Tensor h;     // [B, heads, K, V]
  std::array<torch::Tensor*, 2> tensors() { return {&conv, &h}; }
};
using M2RNNCache = RecurrentCache<M2RNNState>;

// Depthwise causal conv1d + SiLU over x [B, T, C], continuing from the previous kernel-1 inputs.
class CausalConvImpl : public torch::nn::Module {
 public:
  CausalConvImpl(int64_t channels, int64_t kernel, const torch::TensorOptions& options);
  // Returns the activations [B, T, C] and the new conv state [B, C, kernel - 1]. pos [B, T] (optional): each
  // token's position in its packed document; inputs before a document's start read as zero.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& state,
                                                  const torch::Tensor& pos = {});
  torch::Tensor weight, bias;  // [C, 1, kernel], [C]
};
TORCH_MODULE(CausalConv);

class M2RNNImpl : public torch::nn::Module {
 public:
  M2RNNImpl(const Recipe& recipe, const torch::TensorOptions& options);
  // h [B, T, D] (already normalized) continuing from state; returns the mixer output and the new state. docs
  // (optional): packed documents, each starting from a zero state and zero conv inputs.
  std::pair<torch::Tensor, M2RNNState> forward(const torch::Tensor& h, const M2RNNState& state,
                                               const Documents* docs = nullptr);
  M2RNNState zero_state(int64_t batch) const;

  int64_t heads, qk_heads, k_dim, v_dim, conv_channels;
  // The reference clips each state gradient to [-1, 1]; 0 turns clipping off (exact gradients).
  double grad_clip = 1.0;
  Linear in_proj{nullptr}, out_proj{nullptr};
  CausalConv conv{nullptr};
  torch::Tensor A_log, dt_bias, state_weight, D;
  RMSNorm out_norm{nullptr};
};
TORCH_MODULE(M2RNN);

class M2RNNLayer : public Layer {
 public:
  M2RNNLayer(const Recipe& recipe, const torch::TensorOptions& options);
  Family family() const override { return Family::M2RNN; }
  const char* class_name() const override { return "M2RNNLayer"; }
  torch::Tensor forward_normed(const torch::Tensor& h, const Documents* docs = nullptr) override;
  torch::Tensor prefill(const torch::Tensor& x, LayerCache* cache) override;
  std::unique_ptr<LayerCache> make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const override;

  M2RNN m2rnn{nullptr};
};

}  // namespace slm::model
