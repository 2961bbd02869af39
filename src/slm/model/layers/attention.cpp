#include "slm/model/layers/attention.h"

#include <torch/torch.h>

#include "slm/model/decode_state.h"
#include "slm/ops/attention.h"
#include "slm/ops/decode_attention.h"
#include "slm/ops/rotary_norm.h"
#include "slm/util/error.h"

namespace slm::model {

AttentionImpl::AttentionImpl(const Recipe& r, const LayerPlan& plan, const torch::TensorOptions& options)
    : heads(r.attention->heads),
      kv_heads(r.attention->kv_heads),
      head_dim(r.attention->head_dim),
      window(plan.window_tokens),
      rope(r.attention->head_dim, r.attention->rope_theta) {
  const int64_t d = r.d_model;
  wq = register_module("wq", Linear(d, heads * head_dim, options));
  wk = register_module("wk", Linear(d, kv_heads * head_dim, options));
  wv = register_module("wv", Linear(d, kv_heads * head_dim, options));
  wo = register_module("wo", Linear(heads * head_dim, d, options));
  {
    torch::NoGradGuard no_grad;
    wo->weight.dense().zero_();  // a fresh layer adds nothing to the residual stream
  }
  if (r.attention->qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim, r.norm_eps, options));
    k_norm = register_module("k_norm", RMSNorm(head_dim, r.norm_eps, options));
  }
  if (plan.dsa) indexer = register_module("indexer", DsaIndexer(r, window, options));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& h, TokenCache* cache, const Documents* docs) {
  const int64_t b = h.size(0), t = h.size(1);
  // A decode token reads no host state (a CUDA graph replays it), except a DSA layer's dense warm-up stage.
  if (cache && t == 1 && cache->positions().defined() && (!indexer || indexer->stage == DsaStage::Sparse))
    return step_on_device(h, *cache);
  const auto pos = positions(h, cache, docs);
  auto q = wq(h).view({b, t, heads, head_dim});
  auto k = wk(h).view({b, t, kv_heads, head_dim});
  auto v = wv(h).view({b, t, kv_heads, head_dim});
  const auto qw = q_norm ? q_norm->weight : torch::Tensor(), kw = q_norm ? k_norm->weight : torch::Tensor();
  if (!cache && q.scalar_type() == k.scalar_type() && ops::rotary_norm_train_fusable(q, qw) &&
      ops::rotary_norm_train_fusable(k, kw)) {
    // Training (and uncached forwards): one kernel per tensor for the rotation and the QK-norm, and one for their
    // backward, instead of about twenty with the backward's.
    const auto [cos, sin] = rope.tables(h.device(), q.scalar_type(), pos.end);
    q = ops::rotary_norm_train(q, pos.ids, pos.start, cos, sin, qw, q_norm ? q_norm->eps : 0.0);
    k = ops::rotary_norm_train(k, pos.ids, pos.start, cos, sin, kw, q_norm ? k_norm->eps : 0.0);
  } else {
    std::tie(q, k) = rope_and_norm(q, k, pos);
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

std::pair<torch::Tensor, torch::Tensor> AttentionImpl::rope_and_norm(const torch::Tensor& q, const torch::Tensor& k,
                                                                     const RotaryPositions& pos) {
  auto qr = rope(q, pos), kr = rope(k, pos);
  if (!q_norm) return {qr, kr};
  return {q_norm->forward(qr), k_norm->forward(kr)};
}

torch::Tensor AttentionImpl::step_on_device(const torch::Tensor& h, TokenCache& cache) {
  const int64_t b = h.size(0);
  const auto& at = cache.positions();  // [B]: this token's position in each row
  // Tables for the whole capacity, so that no step rebuilds them (a replayed graph would keep reading the old ones).
  const RotaryPositions pos{cache.length(), at.view({b, 1}), cache.capacity()};
  auto q = wq(h).view({b, 1, heads, head_dim});
  auto k = wk(h).view({b, 1, kv_heads, head_dim});
  auto v = wv(h).view({b, 1, kv_heads, head_dim});
  const auto [cos, sin] = rope.tables(h.device(), q.scalar_type(), pos.end);
  const auto qw = q_norm ? q_norm->weight : torch::Tensor(), kw = q_norm ? k_norm->weight : torch::Tensor();
  if (ops::rotary_norm_fusable(q.squeeze(1), cos, qw) && ops::rotary_norm_fusable(k.squeeze(1), cos, kw)) {
    // One kernel per tensor for the rotation and the QK-norm instead of about ten.
    q = ops::rotary_norm_step(q.squeeze(1), at, cos, sin, qw, q_norm ? q_norm->eps : 0.0).unsqueeze(1);
    k = ops::rotary_norm_step(k.squeeze(1), at, cos, sin, kw, q_norm ? k_norm->eps : 0.0).unsqueeze(1);
  } else {
    std::tie(q, k) = rope_and_norm(q, k, pos);
  }
  auto keys = cache.write_step(0, k.transpose(1, 2));
  auto values = cache.write_step(1, v.transpose(1, 2));
  auto o = indexer ? indexer->attend_step(h, q.transpose(1, 2), keys, values,
                                          1.0 / std::sqrt(static_cast<double>(head_dim)), cache, 2)
                   : ops::decode_attention(q.view({b, heads, head_dim}), keys, values, at + 1, window);
  cache.advance(1);
  return wo(o.reshape({b, 1, heads * head_dim}));
}

std::unique_ptr<TokenCache> AttentionImpl::make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const {
  auto c = std::make_unique<TokenCache>(capacity, max_rollback);
  for (int i = 0; i < 2; ++i)
    c->add_stream(torch::zeros({batch, kv_heads, capacity, head_dim}, wk->weight.dense().options()), 2);
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

torch::Tensor AttentionLayer::forward_normed(const torch::Tensor& h, const Documents* docs) {
  return mla ? mla->forward(h, nullptr, false, docs) : attn->forward(h, nullptr, docs);
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

DecodeSupport AttentionLayer::decode_support() const {
  std::string host_length;
  if (mla) host_length = "MLA attention reads its cache by the host's length";
  else if (indexer() && indexer()->stage == DsaStage::Warmup)
    host_length = "DSA attention in its dense warm-up stage reads its cache by the host's length";
  if (!host_length.empty()) return {host_length, host_length};
  if (!indexer() && !ops::decode_attention_has_kernel(attn->head_dim))
    return {"", "attention head dim " + std::to_string(attn->head_dim) +
                    " has no CUDA decode kernel (32, 64, 128, 256), and its reference reads the lengths on the host"};
  return {};
}

}  // namespace slm::model
