#include "slm/model/layers/attention.h"

#include <torch/torch.h>

#include "slm/model/decode_state.h"
#include "slm/ops/attention.h"
#include "slm/util/error.h"

namespace slm::model {

torch::Tensor positions(const torch::Tensor& h, const TokenCache* cache, const Documents* docs) {
  if (docs) {
    if (cache) throw Error("attention: packed documents are a training input; a cached sequence is one document");
    return docs->pos;
  }
  const int64_t offset = cache ? cache->length() : 0;
  return torch::arange(offset, offset + h.size(1), h.options().dtype(torch::kLong)).unsqueeze(0);
}

torch::Tensor apply_rope(const torch::Tensor& x, int64_t offset, double theta) {
  const int64_t t = x.size(1);
  return apply_rope(x, torch::arange(offset, offset + t, x.options().dtype(torch::kLong)).unsqueeze(0), theta);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& positions, double theta) {
  const int64_t t = x.size(1), half = x.size(3) / 2;
  // Angles in float64: float32 loses ~1e-3 rad of phase at positions near 1e5.
  auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(x.device());
  auto inv_freq = torch::pow(theta, -torch::arange(0, half, f64) / static_cast<double>(half));
  auto angles = (positions.to(f64).unsqueeze(-1) * inv_freq).view({-1, t, 1, half});
  auto cos = angles.cos().to(x.scalar_type()), sin = angles.sin().to(x.scalar_type());
  auto x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3);
}

AttentionImpl::AttentionImpl(const Recipe& r, const LayerPlan& plan, const torch::TensorOptions& options)
    : heads(r.attention->heads),
      kv_heads(r.attention->kv_heads),
      head_dim(r.attention->head_dim),
      window(plan.window_tokens),
      rope_theta(r.attention->rope_theta) {
  const int64_t d = r.d_model;
  wq = register_module("wq", Linear(d, heads * head_dim, options));
  wk = register_module("wk", Linear(d, kv_heads * head_dim, options));
  wv = register_module("wv", Linear(d, kv_heads * head_dim, options));
  wo = register_module("wo", Linear(heads * head_dim, d, options));
  {
    torch::NoGradGuard no_grad;
    wo->weight.zero_();  // a fresh layer adds nothing to the residual stream
  }
  if (r.attention->qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, r.norm_eps, options));
    k_norm = register_module("k_norm", RMSNorm(head_dim, r.norm_eps, options));
  }
  if (plan.dsa) indexer = register_module("indexer", DsaIndexer(r, window, options));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& h, TokenCache* cache, const Documents* docs) {
  const int64_t b = h.size(0), t = h.size(1);
  const auto pos = positions(h, cache, docs);
  auto q = apply_rope(wq(h).view({b, t, heads, head_dim}), pos, rope_theta);
  auto k = apply_rope(wk(h).view({b, t, kv_heads, head_dim}), pos, rope_theta);
  auto v = wv(h).view({b, t, kv_heads, head_dim});
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  if (cache) {
    k = cache->write(0, k);
    v = cache->write(1, v);
  }
  auto o = indexer ? indexer->attend(h, q, k, v, 1.0 / std::sqrt(static_cast<double>(head_dim)), cache, 2, docs)
                   : ops::causal_attention(q, k, v, window, std::nullopt, docs ? &docs->spans : nullptr);
  if (cache) cache->advance(t);
  return wo(o.transpose(1, 2).reshape({b, t, heads * head_dim}));
}

std::unique_ptr<TokenCache> AttentionImpl::make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const {
  auto c = std::make_unique<TokenCache>(capacity, max_rollback);
  for (int i = 0; i < 2; ++i)
    c->add_stream(torch::zeros({batch, kv_heads, capacity, head_dim}, wk->weight.options()), 2);
  if (indexer) indexer->add_stream(*c, batch);
  return c;
}

AttentionLayer::AttentionLayer(const Recipe& r, const LayerPlan& plan, const torch::TensorOptions& options)
    : Layer(r.d_model, r.norm_eps, options) {
  if (plan.mla)
    mla = register_module("attn", Mla(r, plan, options));
  else
    attn = register_module("attn", Attention(r, plan, options));
}

TokenCache& AttentionLayer::token_cache(LayerCache* cache) const {
  auto* c = dynamic_cast<TokenCache*>(cache);
  if (!c) throw Error("AttentionLayer: prefill/decode need the TokenCache its make_cache created");
  return *c;
}

torch::Tensor AttentionLayer::forward(const torch::Tensor& x, const Documents* docs) {
  return mla ? mla->forward(norm(x), nullptr, false, docs) : attn->forward(norm(x), nullptr, docs);
}

torch::Tensor AttentionLayer::prefill(const torch::Tensor& x, LayerCache* cache) {
  auto& c = token_cache(cache);
  return mla ? mla(norm(x), &c, false) : attn(norm(x), &c);
}

torch::Tensor AttentionLayer::decode(const torch::Tensor& x, LayerCache* cache) {
  auto& c = token_cache(cache);
  return mla ? mla(norm(x), &c, true) : attn(norm(x), &c);
}

std::unique_ptr<LayerCache> AttentionLayer::make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const {
  return mla ? mla->make_cache(batch, capacity, max_rollback) : attn->make_cache(batch, capacity, max_rollback);
}

DsaIndexerImpl* AttentionLayer::indexer() const {
  const auto& i = mla ? mla->indexer : attn->indexer;
  return i ? i.ptr().get() : nullptr;
}

}  // namespace slm::model
