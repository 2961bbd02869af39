#pragma once
// Attention of one query token per row over a preallocated key/value cache whose filled length is a device tensor:
// the decode step's attention, in a form a CUDA graph can capture once and replay at every position.
//   q [B, H, D]; k, v [B, KV, capacity, D] with H % KV == 0 (query head h reads kv head h / (H / KV));
//   lengths [B] int64 on q's device, 1 <= lengths[b] <= capacity: row b reads keys
//   max(0, lengths[b] - window) .. lengths[b] - 1 (window 0: every key below the length);
//   scale multiplies the scores (1/sqrt(D) when absent);
//   keep (optional) bool [B, capacity] on q's device: only the keys it marks take part (a DSA layer's selection,
//   ops/dsa_select.h); every row must keep at least one key of its range. Returns [B, H, D] in q's dtype.
#include <ATen/core/Tensor.h>

#include <optional>

namespace slm::ops {

// On CUDA (FP32/BF16/FP16, head dim 32/64/128/256) the split-key kernel (cuda/decode_attention_kernels.cu), whose
// grid depends on the capacity only; elsewhere decode_attention_ref.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths,
                            int64_t window, std::optional<double> scale = std::nullopt, const at::Tensor& keep = {});

// Whether decode_attention has its CUDA kernel for this head dim (CUDA builds only). Without it the step takes
// decode_attention_ref, whose host read of the lengths a CUDA graph cannot capture.
bool decode_attention_has_kernel(int64_t head_dim);

// Row by row over the filled keys with libtorch's attention (reads the lengths on the host).
at::Tensor decode_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& lengths, int64_t window, std::optional<double> scale = std::nullopt,
                                const at::Tensor& keep = {});

}  // namespace slm::ops
