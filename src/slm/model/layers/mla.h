#pragma once
// MLA: multi-head latent attention (DeepSeek-V2/V3) as the core of an A layer the recipe marks.
//
//   c^Q = q_a_norm(wq_a h)  (q_lora_rank > 0; else queries come from h through wq)
//   [q^C ; q^R]_h = wq_b c^Q                  q^R rotated (half-split RoPE)
//   [c^KV ; k^R] = wkv_a h;  c^KV = kv_a_norm(c^KV);  k^R rotated; ONE rope key shared by every head
//   [k^C ; v]_h = wkv_b c^KV
//   score_h(t, s) = (q^C_h . k^C_h(s) + q^R_h . k^R(s)) / sqrt(nope + rope);  out = wo [o_1 .. o_H]
//
// The cache holds c^KV (kv_lora_rank) and k^R (qk_rope_head_dim) per token. Training and prefill materialise
// k^C and v per head (non-absorbed); decode folds wkv_b into the query and the output instead (absorbed):
//   q~_h = W^UK_h^T q^C_h,  score = q~_h . c^KV + q^R_h . k^R,  o_h = W^UV_h sum_s p_s c^KV_s
// which is MQA with one (kv_lora + rope)-dim key and one kv_lora-dim value per token.
#include "slm/model/decode_state.h"
#include "slm/model/layers/dsa_indexer.h"
#include "slm/model/layers/rope.h"
#include "slm/model/modules.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

class MlaImpl : public torch::nn::Module {
 public:
  MlaImpl(const Recipe& recipe, const LayerPlan& plan, const torch::TensorOptions& options);
  // h [B, T, D] (already normalised); with a cache, h continues the cached sequence and extends it.
  torch::Tensor forward(const torch::Tensor& h, TokenCache* cache, bool absorbed, const Documents* docs = nullptr);
  // Streams 0 (latents) and 1 (rope keys), then the indexer's keys on DSA layers.
  std::unique_ptr<TokenCache> make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const;

  int64_t heads, q_lora_rank, kv_lora_rank, nope_dim, rope_dim, v_dim, window;
  double scale;
  Rope rope;  // on the qk_rope_head_dim dims of queries and the shared key
  Linear wq_a{nullptr}, wq_b{nullptr}, wq{nullptr}, wkv_a{nullptr}, wkv_b{nullptr}, wo{nullptr};
  RMSNorm q_a_norm{nullptr}, kv_a_norm{nullptr};
  DsaIndexer indexer{nullptr};  // DSA layers only
};
TORCH_MODULE(Mla);

}  // namespace slm::model
