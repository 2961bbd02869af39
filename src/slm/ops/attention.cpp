#include "slm/ops/attention.h"

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

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            std::optional<double> scale, const at::Tensor& doc) {
  check_shapes(q, k, v);
  const int64_t t = q.size(2), s = k.size(2);
  const bool gqa = q.size(1) != k.size(1);
  if (doc.defined())  // [B, 1, T, S]: one mask per row, shared by the heads
    return at::scaled_dot_product_attention(q, k, v, causal_mask(t, s, window, q.device(), doc).unsqueeze(1), 0.0,
                                            false, scale, gqa);
  const bool window_binds = window > 0 && window < s;
  if (!window_binds && t == s)  // is_causal aligns the mask top-left, which is right only when T == S
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, scale, gqa);
  if (!window_binds && t == 1) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale, gqa);
  return at::scaled_dot_product_attention(q, k, v, causal_mask(t, s, window, q.device()), 0.0, false, scale, gqa);
}

at::Tensor causal_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                std::optional<double> scale, const at::Tensor& doc) {
  check_shapes(q, k, v);
  const int64_t group = q.size(1) / k.size(1);
  auto kk = k.repeat_interleave(group, 1);
  auto vv = v.repeat_interleave(group, 1);
  const double c = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  auto scores = torch::matmul(q, kk.transpose(-2, -1)) * c;
  auto mask = causal_mask(q.size(2), k.size(2), window, q.device(), doc);
  if (doc.defined()) mask = mask.unsqueeze(1);
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), vv);
}

}  // namespace slm::ops
