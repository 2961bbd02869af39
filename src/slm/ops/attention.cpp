#include "slm/ops/attention.h"

#include <ATen/core/grad_mode.h>
#include <torch/torch.h>

#include "slm/util/error.h"

namespace slm::ops {

namespace {
void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.sizes().slice(0, 3) != v.sizes().slice(0, 3) ||
      q.size(0) != k.size(0) || q.size(3) != k.size(3) || q.size(1) % k.size(1) != 0 || q.size(2) > k.size(2))
    throw Error(
        "causal_attention: expected q [B,H,T,hd], k [B,KV,S,hd], v [B,KV,S,dv] with H % KV == 0 and "
        "T <= S, got q " +
        std::to_string(q.dim()) + "-d, k " + std::to_string(k.dim()) + "-d");
}
}  // namespace

at::Tensor causal_mask(int64_t t, int64_t s, int64_t window, const at::Device& device, const at::Tensor& doc) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto qpos = torch::arange(s - t, s, opts).unsqueeze(1);
  auto kpos = torch::arange(0, s, opts).unsqueeze(0);
  auto mask = kpos <= qpos;
  if (window > 0) mask = mask & (qpos - kpos < window);
  if (!doc.defined()) return mask;
  if (doc.dim() != 2 || doc.size(1) != s)
    throw Error("causal_mask: document ids must be [B, " + std::to_string(s) + "], got " + std::to_string(doc.dim()) +
                "-d");
  auto d = doc.to(device);
  return mask.unsqueeze(0) & (d.narrow(1, s - t, t).unsqueeze(2) == d.unsqueeze(1));
}

namespace {

// The flash kernel takes BF16/FP16 with equal q/k/v head dims (a multiple of 8, at most 256) and any number of
// query heads per kv head.
bool flash_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const auto dt = q.scalar_type();
  return q.is_cuda() && (dt == at::kBFloat16 || dt == at::kHalf) && k.scalar_type() == dt && v.scalar_type() == dt &&
         q.size(3) == v.size(3) && q.size(3) % 8 == 0 && q.size(3) <= 256 && q.size(2) == k.size(2);
}

// Causal attention with a window (0: none) over documents: the rows' tokens flattened and cut at cu_seqlens
// (every row is one document when docs is null).
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                           std::optional<double> scale, const PackedSpans* docs) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2);
  auto tokens = [&](const at::Tensor& x) { return x.transpose(1, 2).reshape({b * t, x.size(1), x.size(3)}); };
  at::Tensor cu =
      docs ? docs->cu_seqlens : at::arange(0, (b + 1) * t, t, q.options().dtype(at::kInt));  // one document per row
  const int64_t longest = docs ? docs->max_len : t;
  std::optional<int64_t> left;
  if (window > 0 && window < longest) left = window - 1;  // the query itself and window - 1 keys before it
  auto out = std::get<0>(at::_flash_attention_forward(tokens(q), tokens(k), tokens(v), cu, cu, longest, longest, 0.0,
                                                      /*is_causal=*/true, false, scale, left,
                                                      left ? std::optional<int64_t>(0) : std::nullopt));
  return out.view({b, t, h, q.size(3)}).transpose(1, 2);
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            std::optional<double> scale, const PackedSpans* docs) {
  check_shapes(q, k, v);
  const int64_t t = q.size(2);
  // Keys before the first query's window are invisible to every query: a block after a long cache (a decode step)
  // attends over the last t + window - 1 keys only, which for t = 1 needs no mask at all.
  if (const int64_t reach = t + window - 1; !docs && window > 0 && reach < k.size(2))
    return causal_attention(q, k.narrow(2, k.size(2) - reach, reach), v.narrow(2, v.size(2) - reach, reach), window,
                            scale);
  const int64_t s = k.size(2);
  const bool gqa = q.size(1) != k.size(1);
  const bool window_binds = window > 0 && window < s;
  // Inference takes the flash kernel wherever it fits: SDPA's cuDNN backend builds a plan for every new batch size
  // and length, which cost a continuous-batching engine ~0.1-0.2 s whenever its prompts grouped in a new way
  // (bench/RESULTS.md). Training keeps cuDNN where it applies (fixed shapes).
  const bool inference = !at::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad() || v.requires_grad());
  if ((docs || window_binds || inference) && (!docs || docs->cu_seqlens.defined()) && flash_fits(q, k, v))
    return flash_attention(q, k, v, window, scale, docs);
  if (docs) {  // [B, 1, T, S]: one mask per row, shared by the heads
    if (t != s) throw Error("causal_attention: packed documents need the whole rows (T == S)");
    return at::scaled_dot_product_attention(q, k, v, causal_mask(t, s, window, q.device(), docs->id).unsqueeze(1), 0.0,
                                            false, scale, gqa);
  }
  if (!window_binds && t == s)  // is_causal aligns the mask top-left, which is right only when T == S
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, scale, gqa);
  if (!window_binds && t == 1) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale, gqa);
  return at::scaled_dot_product_attention(q, k, v, causal_mask(t, s, window, q.device()), 0.0, false, scale, gqa);
}

at::Tensor causal_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                std::optional<double> scale, const PackedSpans* docs) {
  check_shapes(q, k, v);
  const int64_t group = q.size(1) / k.size(1);
  auto kk = k.repeat_interleave(group, 1);
  auto vv = v.repeat_interleave(group, 1);
  const double c = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  auto scores = torch::matmul(q, kk.transpose(-2, -1)) * c;
  auto mask = causal_mask(q.size(2), k.size(2), window, q.device(), docs ? docs->id : at::Tensor());
  if (docs) mask = mask.unsqueeze(1);
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), vv);
}

}  // namespace slm::ops
