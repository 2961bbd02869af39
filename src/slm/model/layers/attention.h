#pragma once
// A: an attention-only layer. Separate q, k, v projections, grouped-query heads, RoPE (half-split) and then
// RMSNorm on q and k (QK-norm), causal, with the per-layer window of the plan.
#include "slm/model/layer.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

class KVCache;

// Rotates x [B, T, heads, hd] by the angles of positions offset..offset+T-1: the first and second halves
// of the head dim form the (real, imaginary) pairs, frequency theta^(-2i/hd) for pair i.
torch::Tensor apply_rope(const torch::Tensor& x, int64_t offset, double theta);

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const Recipe& recipe, const LayerPlan& plan, const torch::TensorOptions& options);
  // h [B, T, D] (already normalized). With a cache, h continues the cached sequence.
  torch::Tensor forward(const torch::Tensor& h, KVCache* cache);

  int64_t heads, kv_heads, head_dim, window;
  double rope_theta;
  Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // null when the recipe turns qk_norm off
};
TORCH_MODULE(Attention);

class AttentionLayer : public Layer {
 public:
  AttentionLayer(const Recipe& recipe, const LayerPlan& plan, const torch::TensorOptions& options);
  char letter() const override { return 'A'; }
  const char* class_name() const override { return "AttentionLayer"; }
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor prefill(const torch::Tensor& x, LayerCache* cache) override;
  std::unique_ptr<LayerCache> make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const override;

  Attention attn{nullptr};
};

}  // namespace slm::model
