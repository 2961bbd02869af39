#include "slm/model/layers/mla.h"

#include <torch/torch.h>

#include <cmath>

#include "slm/ops/attention.h"

namespace slm::model {

MlaImpl::MlaImpl(const Recipe& r, const LayerPlan& plan, const torch::TensorOptions& options)
    : heads(r.attention->heads),
      q_lora_rank(r.attention->mla.q_lora_rank),
      kv_lora_rank(r.attention->mla.kv_lora_rank),
      nope_dim(r.attention->mla.qk_nope_head_dim),
      rope_dim(r.attention->mla.qk_rope_head_dim),
      v_dim(r.attention->mla.v_head_dim),
      window(plan.window_tokens),
      scale(1.0 / std::sqrt(static_cast<double>(nope_dim + rope_dim))),
      rope(rope_dim, r.attention->rope_theta) {
  const int64_t d = r.d_model, qk = nope_dim + rope_dim;
  if (q_lora_rank > 0) {
    wq_a = register_module("wq_a", Linear(d, q_lora_rank, options));
    q_a_norm = register_module("q_a_norm", RMSNorm(q_lora_rank, r.norm_eps, options));
    wq_b = register_module("wq_b", Linear(q_lora_rank, heads * qk, options));
  } else {
    wq = register_module("wq", Linear(d, heads * qk, options));
  }
  wkv_a = register_module("wkv_a", Linear(d, kv_lora_rank + rope_dim, options));
  kv_a_norm = register_module("kv_a_norm", RMSNorm(kv_lora_rank, r.norm_eps, options));
  wkv_b = register_module("wkv_b", Linear(kv_lora_rank, heads * (nope_dim + v_dim), options));
  wo = register_module("wo", Linear(heads * v_dim, d, options));
  {
    torch::NoGradGuard no_grad;
    wo->weight.dense().zero_();  // a fresh layer adds nothing to the residual stream
  }
  if (plan.dsa) indexer = register_module("indexer", DsaIndexer(r, window, options));
}

torch::Tensor MlaImpl::forward(const torch::Tensor& h, TokenCache* cache, bool absorbed, const Documents* docs) {
  const int64_t b = h.size(0), t = h.size(1);
  const auto pos = positions(h, cache, docs);
  auto q = (wq ? wq(h) : wq_b(q_a_norm(wq_a(h)))).view({b, t, heads, nope_dim + rope_dim});
  auto q_nope = q.narrow(3, 0, nope_dim);
  auto q_rope = rope(q.narrow(3, nope_dim, rope_dim), pos);
  auto kv = wkv_a(h);
  auto latent = kv_a_norm(kv.narrow(2, 0, kv_lora_rank));
  auto k_rope = rope(kv.narrow(2, kv_lora_rank, rope_dim).unsqueeze(2), pos).squeeze(2);
  if (cache) {
    latent = cache->write(0, latent);
    k_rope = cache->write(1, k_rope);
  }
  const int64_t s = latent.size(1);
  // The absorbed form multiplies by blocks of wkv_b from the other side, which needs the dense matrix; a weight
  // released for a quantized kernel (no elements) takes the non-absorbed form, which gives the same output.
  absorbed = absorbed && wkv_b->weight.dense().numel() > 0;
  // [H, nope + v, kv_lora]: per head, W^UK (rows 0..nope) then W^UV.
  auto w_ukv = absorbed ? wkv_b->weight.dense().view({heads, nope_dim + v_dim, kv_lora_rank}) : torch::Tensor();
  // Attention operands q [B, H, T, dk], k [B, KV, S, dk], v [B, KV, S, dv].
  torch::Tensor qa, ka, va;
  if (absorbed) {
    auto q_latent = torch::einsum("bthn,hnc->bhtc", {q_nope, w_ukv.narrow(1, 0, nope_dim)});
    qa = torch::cat({q_latent, q_rope.transpose(1, 2)}, -1);
    ka = torch::cat({latent, k_rope}, -1).unsqueeze(1);
    va = latent.unsqueeze(1);
  } else {
    auto kvb = wkv_b(latent).view({b, s, heads, nope_dim + v_dim});
    auto k_shared = k_rope.unsqueeze(2).expand({b, s, heads, rope_dim});
    qa = torch::cat({q_nope, q_rope}, -1).transpose(1, 2);
    ka = torch::cat({kvb.narrow(3, 0, nope_dim), k_shared}, -1).transpose(1, 2);
    va = kvb.narrow(3, nope_dim, v_dim).transpose(1, 2);
  }
  auto o = indexer ? indexer->attend(h, qa, ka, va, scale, cache, 2, docs)
                   : ops::causal_attention(qa, ka, va, window, scale, docs ? &docs->spans : nullptr);
  if (cache) cache->advance(t);
  o = absorbed ? torch::einsum("bhtc,hvc->bthv", {o, w_ukv.narrow(1, nope_dim, v_dim)}) : o.transpose(1, 2);
  return wo(o.reshape({b, t, heads * v_dim}));
}

std::unique_ptr<TokenCache> MlaImpl::make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const {
  auto c = std::make_unique<TokenCache>(capacity, max_rollback);
  const auto opts = wkv_a->weight.dense().options();
  c->add_stream(torch::zeros({batch, capacity, kv_lora_rank}, opts), 1);
  c->add_stream(torch::zeros({batch, capacity, rope_dim}, opts), 1);
  if (indexer) indexer->add_stream(*c, batch);
  return c;
}

}  // namespace slm::model
