#pragma once
// A: an attention-only layer. Separate q, k, v projections, grouped-query heads, RoPE (half-split) and then
// RMSNorm on q and k (QK-norm), causal, with the per-layer window of the plan. Layers the plan marks mla use
// multi-head latent attention (layers/mla.h) instead; layers it marks dsa add DeepSeek sparse attention's
// indexer (layers/dsa_indexer.h) to either core.
#include <utility>

#include "slm/model/decode_state.h"
#include "slm/model/layer.h"
#include "slm/model/layers/dsa_indexer.h"
#include "slm/model/layers/mla.h"
#include "slm/model/layers/rope.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const Recipe& recipe, const LayerPlan& plan, const torch::TensorOptions& options);
  // h [B, T, D] (already normalized). With a cache, h continues the cached sequence and extends it; without
  // one, docs (optional) says where packed documents start. One token takes step_on_device (except a DSA layer in
  // its dense warm-up stage).
  torch::Tensor forward(const torch::Tensor& h, TokenCache* cache, const Documents* docs = nullptr);
  // The decode step that reads no host state: rotary angles, the cache write and the attended length all come from
  // the cache's device positions (ops::decode_attention; a DSA layer selects its keys with dsa_select_at over the
  // whole capacity), so a CUDA graph of it replays at any position, and the rows of a continuous-batching pool each
  // attend at their own length.
  torch::Tensor step_on_device(const torch::Tensor& h, TokenCache& cache);
  // Streams 0 (keys [B, kv_heads, capacity, head_dim]) and 1 (values), then the indexer's keys on DSA layers.
  std::unique_ptr<TokenCache> make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const;

  int64_t heads, kv_heads, head_dim, window;
  Rope rope;
  Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // null when the recipe turns qk_norm off
  DsaIndexer indexer{nullptr};               // DSA layers only

 private:
  // The rotation and QK-norm of q and k [B, T, heads, head_dim] as tensor ops (where no fused kernel applies).
  std::pair<torch::Tensor, torch::Tensor> rope_and_norm(const torch::Tensor& q, const torch::Tensor& k,
                                                        const RotaryPositions& pos);
};
TORCH_MODULE(Attention);

class AttentionLayer : public Layer {
 public:
  AttentionLayer(const Recipe& recipe, const LayerPlan& plan, const torch::TensorOptions& options);
  Family family() const override { return Family::Attention; }
  const char* class_name() const override { return "AttentionLayer"; }
  torch::Tensor forward_normed(const torch::Tensor& h, const Documents* docs = nullptr) override;
  torch::Tensor prefill(const torch::Tensor& x, LayerCache* cache) override;
  // MLA layers decode in the weight-absorbed form; GQA layers as prefill.
  torch::Tensor decode(const torch::Tensor& x, LayerCache* cache) override;
  std::unique_ptr<LayerCache> make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const override;
  // MLA and DSA's dense warm-up read their cache by the host's length; GQA graphs need a CUDA decode kernel.
  DecodeSupport decode_support() const override;
  // The DSA indexer of this layer; null when the plan puts no DSA here.
  DsaIndexerImpl* indexer() const;

  // Exactly one core is set; either registers as "attn", so parameter names follow the accounting.
  Attention attn{nullptr};  // GQA
  Mla mla{nullptr};         // MLA

 private:
  TokenCache& token_cache(LayerCache* cache) const;
};

}  // namespace slm::model
