#include "slm/model/layers/dsa_indexer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "slm/ops/attention.h"
#include "slm/ops/decode_attention.h"
#include "slm/ops/dsa_select.h"
#include "slm/ops/sparse_attention.h"
#include "slm/util/error.h"

namespace slm::model {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Query rows x heads x keys one scoring chunk may hold (64 MiB in fp32).
constexpr int64_t kChunkElements = int64_t{1} << 24;
}  // namespace

int64_t dsa_keys_per_query(int64_t visible, double ratio, int64_t local_window) {
  // The epsilon keeps ratios such as 0.29 * 100 from flooring to 28.
  const auto by_ratio = static_cast<int64_t>(std::floor(ratio * static_cast<double>(visible) + 1e-9));
  return std::min(visible, std::max(by_ratio, local_window));
}

torch::Tensor dsa_select(const torch::Tensor& scores, double ratio, int64_t local_window, int64_t window,
                         const torch::Tensor& doc) {
  torch::NoGradGuard no_grad;
  if (scores.dim() != 3) throw Error("dsa_select: scores must be [B, T, S]");
  const int64_t t = scores.size(1), s = scores.size(2), offset = s - t;
  if (offset < 0) throw Error("dsa_select: more queries than keys");
  const auto dev = scores.device();
  auto visible = ops::causal_mask(t, s, window, dev, doc);  // [T, S], or [B, T, S] with documents
  if (visible.dim() == 2) visible = visible.unsqueeze(0);
  auto lopts = torch::TensorOptions().dtype(torch::kLong).device(dev);
  auto distance = torch::arange(offset, s, lopts).unsqueeze(1) - torch::arange(0, s, lopts).unsqueeze(0);
  auto forced = visible & (distance < local_window);
  auto ranked = scores.masked_fill(visible.logical_not(), -kInf).masked_fill(forced, kInf);

  // k(p) from the number of keys each query sees (its document's keys within the window).
  auto seen = visible.sum(-1).cpu();  // [B or 1, T]
  auto keep = torch::empty_like(seen);
  auto seen_a = seen.accessor<int64_t, 2>();
  auto keep_a = keep.accessor<int64_t, 2>();
  int64_t widest = 0;
  for (int64_t r = 0; r < seen.size(0); ++r)
    for (int64_t i = 0; i < t; ++i) {
      keep_a[r][i] = dsa_keys_per_query(seen_a[r][i], ratio, local_window);
      widest = std::max(widest, keep_a[r][i]);
    }
  // A stable sort breaks ties (ReLU scores are often exactly 0) by position, identically in prefill and decode.
  auto order = std::get<1>(torch::sort(ranked, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(-1, 0, widest);
  return order.masked_fill(torch::arange(widest, lopts).view({1, 1, widest}) >= keep.to(dev).unsqueeze(-1), -1);
}

torch::Tensor dsa_select_at(const torch::Tensor& scores, const torch::Tensor& position, double ratio,
                            int64_t local_window, int64_t window) {
  torch::NoGradGuard no_grad;
  if (scores.dim() != 3 || scores.size(1) != 1 || position.dim() != 1 || position.size(0) != scores.size(0))
    throw Error("dsa_select_at: expected scores [B, 1, S] and positions [B]");
  const int64_t s = scores.size(2);
  const auto lopts = torch::TensorOptions().dtype(torch::kLong).device(scores.device());
  const auto p = position.to(torch::kLong).view({-1, 1, 1});
  const auto distance = p - torch::arange(s, lopts).view({1, 1, s});
  auto visible = distance >= 0;
  if (window > 0) visible = visible & (distance < window);
  const auto ranked =
      scores.masked_fill(visible.logical_not(), -kInf).masked_fill(visible & (distance < local_window), kInf);
  // k(p) as dsa_keys_per_query computes it, in the same double arithmetic.
  const auto seen = window > 0 ? (p + 1).clamp_max(window) : p + 1;
  const auto by_ratio = (seen.to(torch::kDouble) * ratio + 1e-9).floor().to(torch::kLong);
  const auto keep = torch::minimum(seen, by_ratio.clamp_min(local_window));
  const int64_t widest = dsa_keys_per_query(window > 0 ? std::min(s, window) : s, ratio, local_window);
  // The keys past the position rank last (-inf), after every visible one, so the first k(p) are dsa_select's.
  auto order = std::get<1>(torch::sort(ranked, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(-1, 0, widest);
  return order.masked_fill(torch::arange(widest, lopts).view({1, 1, widest}) >= keep, -1);
}

torch::Tensor dsa_kl(const torch::Tensor& target, const torch::Tensor& logits) {
  const auto acc = logits.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  auto p = target.to(acc);
  auto log_q = torch::log_softmax(logits.to(acc), -1);
  // 0 * log 0 = 0; masking both factors keeps -inf out of the products (and NaN out of the gradient).
  auto present = p > 0;
  auto terms = p * (p.masked_fill(present.logical_not(), 1).log() - log_q.masked_fill(present.logical_not(), 0));
  return terms.sum(-1).mean();
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_, const torch::TensorOptions& options) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}, options));
  bias = register_parameter("bias", torch::zeros({dim}, options));
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

DsaIndexerImpl::DsaIndexerImpl(const Recipe& r, int64_t window_tokens, const torch::TensorOptions& options)
    : heads(r.attention->dsa_indexer_heads),
      dim(r.attention->dsa_indexer_dim),
      rope_dims(r.attention->dsa_indexer_dim / 4 * 2),  // DeepSeek rotates half the indexer dims (64 of 128)
      local_window(r.attention->dsa_local_window),
      window(window_tokens),
      ratio(r.attention->dsa_top_k_ratio),
      rope_(rope_dims, r.attention->rope_theta) {
  const int64_t d = r.d_model;
  wq = register_module("wq", Linear(d, heads * dim, options));
  wk = register_module("wk", Linear(d, dim, options));
  k_norm = register_module("k_norm", LayerNorm(dim, r.norm_eps, options));
  weights_proj = register_module("weights_proj", Linear(d, heads, options));
}

torch::Tensor DsaIndexerImpl::rotate(const torch::Tensor& x, const RotaryPositions& pos) const {
  if (rope_dims == 0) return x;
  return torch::cat({rope_(x.narrow(-1, 0, rope_dims), pos), x.narrow(-1, rope_dims, dim - rope_dims)}, -1);
}

torch::Tensor DsaIndexerImpl::keys(const torch::Tensor& h, const RotaryPositions& pos) {
  const int64_t b = h.size(0), t = h.size(1);
  return rotate(k_norm(wk(h)).view({b, t, 1, dim}), pos).view({b, t, dim});
}

torch::Tensor DsaIndexerImpl::scores(const torch::Tensor& h, const torch::Tensor& keys, const RotaryPositions& pos) {
  const int64_t b = h.size(0), t = h.size(1), s = keys.size(1);
  auto q = rotate(wq(h).view({b, t, heads, dim}), pos);
  auto w = weights_proj(h) * (1.0 / std::sqrt(static_cast<double>(heads * dim)));
  auto kt = keys.transpose(1, 2);  // [B, d_I, S]
  const int64_t chunk = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(1, b * heads * s));
  std::vector<torch::Tensor> parts;
  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    const int64_t c = std::min(chunk, t - t0);
    auto dots = torch::matmul(q.narrow(1, t0, c).reshape({b, c * heads, dim}), kt).view({b, c, heads, s});
    parts.push_back(torch::matmul(w.narrow(1, t0, c).unsqueeze(2), torch::relu(dots)).squeeze(2));  // [B, c, S]
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts, 1);
}

int DsaIndexerImpl::add_stream(TokenCache& cache, int64_t batch) const {
  return cache.add_stream(torch::zeros({batch, cache.capacity(), dim}, wk->weight.dense().options()), 1);
}

torch::Tensor DsaIndexerImpl::attend(const torch::Tensor& h, const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, double scale, TokenCache* cache, int slot,
                                     const Documents* docs) {
  const int64_t t = q.size(2), s = k.size(2);
  const bool train = is_training() && !cache;
  auto x = h.detach();
  const auto pos = positions(x, cache, docs);
  const auto doc = docs ? docs->spans.id : torch::Tensor();
  auto new_keys = keys(x, pos);
  auto all_keys = cache ? cache->write(slot, new_keys) : new_keys;
  loss_ = torch::Tensor();
  if (stage == DsaStage::Warmup) {
    auto out = ops::causal_attention(q, k, v, window, scale, docs ? &docs->spans : nullptr);
    if (train) {
      auto target = ops::causal_head_probs(q.detach(), k.detach(), scale, window, doc) / static_cast<double>(q.size(1));
      auto visible = ops::causal_mask(t, s, window, q.device(), doc);
      loss_ = dsa_kl(target, scores(x, all_keys, pos).masked_fill(visible.logical_not(), -kInf));
    }
    return out;
  }
  auto sc = scores(x, all_keys, pos);
  auto index = dsa_select(sc, ratio, local_window, window, doc);
  auto res = ops::sparse_attention(q, k, v, index, scale, train);
  if (train) {
    auto picked = sc.gather(-1, index.clamp_min(0)).masked_fill(index < 0, -kInf);
    loss_ = dsa_kl(res.head_probs / static_cast<double>(q.size(1)), picked);
  }
  return res.out;
}

torch::Tensor DsaIndexerImpl::attend_step(const torch::Tensor& h, const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v, double scale, TokenCache& cache, int slot) {
  const int64_t b = h.size(0);
  const auto x = h.detach();
  const auto& at = cache.positions();
  const RotaryPositions pos{cache.length(), at.view({b, 1}), cache.capacity()};
  const auto all_keys = cache.write_step(slot, keys(x, pos));  // [B, capacity, d_I]
  const auto sc = scores(x, all_keys, pos);                    // [B, 1, capacity]
  if (ops::dsa_keep_fusable(sc.squeeze(1), local_window) && ops::decode_attention_has_kernel(q.size(-1))) {
    // The selected set as a mask over the cache, attended by the decode kernel: two launches where the sort, the
    // ops around it, the gather and a dense attention were ~25 (ops/dsa_select.h).
    const auto keep = ops::dsa_keep_step(sc.squeeze(1), at, ratio, local_window, window);
    return ops::decode_attention(q.squeeze(2), k, v, at + 1, window, scale, keep).unsqueeze(2);
  }
  const auto index = dsa_select_at(sc, at, ratio, local_window, window);
  return ops::sparse_attention(q, k, v, index, scale).out;
}

}  // namespace slm::model
