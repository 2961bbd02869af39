#include "slm/ops/decode_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/decode_attention_kernels.h"
#endif

namespace slm::ops {

namespace {

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths,
           const at::Tensor& keep) {
  if (q.dim() != 3 || k.dim() != 4 || v.dim() != 4 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(2) != k.size(3) || k.size(1) < 1 || q.size(1) % k.size(1) != 0)
    throw Error("decode_attention: expected q [B, H, D], k and v [B, KV, capacity, D] with H % KV == 0");
  if (lengths.dim() != 1 || lengths.size(0) != q.size(0) || lengths.scalar_type() != at::kLong ||
      lengths.device() != q.device())
    throw Error("decode_attention: lengths must be int64 [B] on the query's device");
  if (keep.defined() && (keep.dim() != 2 || keep.size(0) != q.size(0) || keep.size(1) != k.size(2) ||
                         keep.scalar_type() != at::kBool || keep.device() != q.device()))
    throw Error("decode_attention: keep must be bool [B, capacity] on the query's device");
}

#ifdef SLM_WITH_CUDA
bool kernel_fits(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const auto dt = q.scalar_type();
  return q.is_cuda() && decode_dtype_supported(dt) && k.scalar_type() == dt && v.scalar_type() == dt &&
         k.is_contiguous() && v.is_contiguous() && cuda::decode_attention_supported(q.size(2));
}

at::Tensor decode_attention_cuda(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& lengths, int64_t window, double scale, const at::Tensor& keep_in) {
  const c10::cuda::CUDAGuard guard(q_in.device());
  auto q = q_in.contiguous();
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2), cap = k.size(2);
  // Up to 8 CTAs per SM, keys of at least 32 per CTA (two rounds of kKeys per warp); both depend on static shapes
  // only. A CTA's keys are a chain of memory latencies, so at batch 1 the split count sets the time: with 2 CTAs per
  // SM and 64 keys per CTA the 2,000-token attention of the cmake specialist took 16 us per layer on an H200.
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t splits =
      std::max<int64_t>(1, std::min({(cap + 31) / 32, (8 * sms + b * h - 1) / (b * h), cuda::kMaxSplits}));
  cuda::DecodeAttentionShape s{b, h, k.size(1), d, cap, window, splits, static_cast<float>(scale)};
  auto f32 = q.options().dtype(at::kFloat);
  auto ml = at::empty({b, h, splits, 2}, f32), acc = at::empty({b, h, splits, d}, f32);
  auto out = at::empty_like(q);
  const auto dtype = decode_dtype(q.scalar_type());
  const auto keep = keep_in.defined() ? keep_in.contiguous() : at::Tensor();
  const std::string err =
      cuda::decode_attention(s, dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), lengths.data_ptr<int64_t>(),
                             keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr,
                             out.data_ptr(), ml.data_ptr<float>(), acc.data_ptr<float>(), current_stream(q));
  if (!err.empty()) throw Error("decode_attention: " + err);
  return out;
}
#endif

}  // namespace

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths,
                            int64_t window, std::optional<double> scale, const at::Tensor& keep) {
  check(q, k, v, lengths, keep);
#ifdef SLM_WITH_CUDA
  if (kernel_fits(q, k, v))
    return decode_attention_cuda(q, k, v, lengths, window,
                                 scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(2)))), keep);
#endif
  return decode_attention_ref(q, k, v, lengths, window, scale, keep);
}

bool decode_attention_has_kernel(int64_t head_dim) {
#ifdef SLM_WITH_CUDA
  return cuda::decode_attention_supported(head_dim);
#else
  (void)head_dim;
  return false;
#endif
}

at::Tensor decode_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& lengths, int64_t window, std::optional<double> scale,
                                const at::Tensor& keep) {
  check(q, k, v, lengths, keep);
  auto len = lengths.cpu();
  const auto* lp = len.data_ptr<int64_t>();
  const int64_t b = q.size(0), cap = k.size(2);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < b; ++i) {
    if (lp[i] < 1 || lp[i] > cap)
      throw Error("decode_attention: row " + std::to_string(i) + " holds " + std::to_string(lp[i]) +
                  " keys, outside 1.." + std::to_string(cap));
    const int64_t first = window > 0 ? std::max<int64_t>(0, lp[i] - window) : 0, n = lp[i] - first;
    auto kk = k.select(0, i).narrow(1, first, n).unsqueeze(0), vv = v.select(0, i).narrow(1, first, n).unsqueeze(0);
    auto qq = q.select(0, i).unsqueeze(0).unsqueeze(2);  // [1, H, 1, D]
    std::optional<at::Tensor> mask;  // an undefined tensor inside the optional is not "no mask" to SDPA
    if (keep.defined()) mask = keep.select(0, i).narrow(0, first, n).view({1, 1, 1, n});
    rows.push_back(at::scaled_dot_product_attention(qq, kk, vv, mask, 0.0, false, scale, q.size(1) != k.size(1))
                       .squeeze(2)
                       .squeeze(0));
  }
  return at::stack(rows);
}

}  // namespace slm::ops
