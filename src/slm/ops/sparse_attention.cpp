#include "slm/ops/sparse_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include "slm/ops/attention.h"
#include "slm/util/error.h"

namespace slm::ops {

namespace {

// Elements one query chunk may gather or score (64 MiB in fp32): long sequences never materialise T x S x heads.
constexpr int64_t kChunkElements = int64_t{1} << 24;
constexpr double kInf = std::numeric_limits<double>::infinity();

void check_shapes(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor* index) {
  const bool ok = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes().slice(0, 3) == v.sizes().slice(0, 3) &&
                  q.size(0) == k.size(0) && q.size(3) == k.size(3) && q.size(1) % k.size(1) == 0;
  if (!ok) throw Error(std::string(op) + ": expected q [B,H,T,dk], k [B,KV,S,dk], v [B,KV,S,dv] with H % KV == 0");
  if (index && (index->dim() != 3 || index->size(0) != q.size(0) || index->size(1) != q.size(2) ||
                index->scalar_type() != torch::kLong))
    throw Error(std::string(op) + ": index must be int64 [B, T, K] for q [B, H, T, dk]");
}

// Softmax in at least fp32: bf16 probabilities over thousands of keys lose the small ones.
at::Tensor softmax_last(const at::Tensor& scores) {
  if (scores.scalar_type() == torch::kDouble || scores.scalar_type() == torch::kFloat)
    return torch::softmax(scores, -1);
  return torch::softmax(scores, -1, torch::kFloat).to(scores.scalar_type());
}

// Attention probabilities summed over the heads, [B, T, S] (no gradient), where allowed(t0, c) is the [B or 1, c, S]
// mask of query rows t0..t0+c-1; computed in query chunks.
at::Tensor masked_head_probs(const at::Tensor& q, const at::Tensor& k, double scale,
                             const std::function<at::Tensor(int64_t, int64_t)>& allowed) {
  torch::NoGradGuard no_grad;
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), dk = q.size(3);
  const int64_t kv = k.size(1), s = k.size(2), group = h / kv;
  auto kt = k.transpose(-2, -1);  // [B, KV, dk, S]
  const int64_t chunk = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(1, b * h * s));
  std::vector<at::Tensor> parts;
  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    const int64_t c = std::min(chunk, t - t0);
    auto qc = q.narrow(2, t0, c).reshape({b, kv, group * c, dk});
    auto scores = (torch::matmul(qc, kt) * scale).view({b, h, c, s});
    scores = scores.masked_fill(allowed(t0, c).unsqueeze(1).logical_not(), -kInf);
    auto p =
        scores.scalar_type() == torch::kDouble ? torch::softmax(scores, -1) : torch::softmax(scores, -1, torch::kFloat);
    parts.push_back(p.sum(1));
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts, 1);
}

SparseAttentionOutput gathered(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& index,
                               double scale, bool head_probs) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), dk = q.size(3);
  const int64_t kv = k.size(1), s = k.size(2), dv = v.size(3), slots = index.size(2), group = h / kv;
  // One row per (sequence, key position) holding every KV head, so a single index_select gathers a slot.
  auto k_rows = k.transpose(1, 2).reshape({b * s, kv * dk});
  auto v_rows = v.transpose(1, 2).reshape({b * s, kv * dv});
  auto valid = index.ge(0);
  auto rows = index.clamp_min(0) + torch::arange(b, index.options()).view({b, 1, 1}) * s;
  const int64_t per_query = b * slots * (kv * (dk + dv) + h);
  const int64_t chunk = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(1, per_query));

  std::vector<at::Tensor> outs, probs;
  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    const int64_t c = std::min(chunk, t - t0);
    auto idx = rows.narrow(1, t0, c).reshape({-1});
    auto kg = k_rows.index_select(0, idx).view({b, c, slots, kv, dk}).permute({0, 3, 1, 4, 2});  // [B,KV,c,dk,K]
    auto vg = v_rows.index_select(0, idx).view({b, c, slots, kv, dv}).permute({0, 3, 1, 2, 4});  // [B,KV,c,K,dv]
    auto qc = q.narrow(2, t0, c).reshape({b, kv, group, c, dk}).transpose(2, 3);                 // [B,KV,c,G,dk]
    auto scores = torch::matmul(qc, kg) * scale;                                                 // [B,KV,c,G,K]
    scores = scores.masked_fill(valid.narrow(1, t0, c).view({b, 1, c, 1, slots}).logical_not(), -kInf);
    auto p = softmax_last(scores);
    outs.push_back(torch::matmul(p, vg).transpose(2, 3).reshape({b, h, c, dv}));
    if (head_probs) probs.push_back(p.detach().sum({1, 3}));
  }
  SparseAttentionOutput out;
  out.out = outs.size() == 1 ? outs[0] : torch::cat(outs, 2);
  if (head_probs) out.head_probs = probs.size() == 1 ? probs[0] : torch::cat(probs, 1);
  return out;
}

SparseAttentionOutput masked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& index,
                             double scale, bool head_probs) {
  const int64_t b = q.size(0), t = q.size(2), s = k.size(2);
  // Unused slots scatter into an extra column that is then cut off, so they never clear a listed key.
  auto valid = index.ge(0);
  auto allowed = torch::zeros({b, t, s + 1}, index.options().dtype(torch::kBool))
                     .scatter_(2, index.masked_fill(valid.logical_not(), s), true)
                     .narrow(2, 0, s);
  SparseAttentionOutput out;
  out.out = at::scaled_dot_product_attention(q, k, v, allowed.unsqueeze(1), 0.0, false, scale, q.size(1) != k.size(1));
  if (head_probs) {
    auto dense = masked_head_probs(q, k, scale, [&](int64_t t0, int64_t c) { return allowed.narrow(1, t0, c); });
    out.head_probs = dense.gather(-1, index.clamp_min(0)).masked_fill(valid.logical_not(), 0.0);
  }
  return out;
}

}  // namespace

SparseAttentionOutput sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& index, double scale, bool head_probs, SparsePath path) {
  check_shapes("sparse_attention", q, k, v, &index);
  if (path == SparsePath::Auto) path = q.size(2) <= 16 && k.size(1) == 1 ? SparsePath::Gather : SparsePath::Masked;
  return path == SparsePath::Gather ? gathered(q, k, v, index, scale, head_probs)
                                    : masked(q, k, v, index, scale, head_probs);
}

SparseAttentionOutput sparse_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& index, double scale) {
  check_shapes("sparse_attention_ref", q, k, v, &index);
  const int64_t b = q.size(0), t = q.size(2), s = k.size(2), group = q.size(1) / k.size(1);
  auto idx = index.to(torch::kCPU);
  auto allowed = torch::zeros({b, 1, t, s}, torch::kBool);
  auto ia = idx.accessor<int64_t, 3>();
  auto ma = allowed.accessor<bool, 4>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < t; ++j)
      for (int64_t slot = 0; slot < idx.size(2); ++slot)
        if (ia[i][j][slot] >= 0) ma[i][0][j][ia[i][j][slot]] = true;
  auto f64 = [](const at::Tensor& x) { return x.to(torch::kCPU, torch::kDouble); };
  auto kk = f64(k).repeat_interleave(group, 1), vv = f64(v).repeat_interleave(group, 1);
  auto scores = torch::matmul(f64(q), kk.transpose(-2, -1)) * scale;
  auto p = torch::softmax(scores.masked_fill(allowed.logical_not(), -kInf), -1);
  return {torch::matmul(p, vv), p};
}

at::Tensor causal_head_probs(const at::Tensor& q, const at::Tensor& k, double scale, int64_t window,
                             const at::Tensor& doc) {
  check_shapes("causal_head_probs", q, k, k, nullptr);
  if (q.size(2) > k.size(2)) throw Error("causal_head_probs: more queries than keys");
  auto mask = causal_mask(q.size(2), k.size(2), window, q.device(), doc);
  if (!doc.defined()) mask = mask.unsqueeze(0);
  return masked_head_probs(q, k, scale, [&](int64_t t0, int64_t c) { return mask.narrow(1, t0, c); });
}

}  // namespace slm::ops
