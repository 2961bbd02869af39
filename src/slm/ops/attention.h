#pragma once
// Causal (optionally sliding-window) attention over a query block that ends the key sequence.
//   q [B, H, T, hd], k [B, KV, S, hd], v [B, KV, S, dv] with S >= T: query i sits at position S - T + i.
//   Grouped-query: H % KV == 0, query head h reads kv head h / (H / KV).
//   window > 0: a query at position p sees keys p - window + 1 .. p (window tokens, itself included);
//   window == 0: every earlier key.
//   scale multiplies the scores; 1/sqrt(hd) when absent (MLA's absorbed form scores in a wider space).
//   doc [B, S] (optional, packed training rows): the document id of every key position, the queries being the
//   last T positions; a query reads only keys of its own document.
#include <ATen/core/Tensor.h>

#include <optional>

namespace slm::ops {

// at::scaled_dot_product_attention, with an explicit mask only where is_causal cannot express it.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            std::optional<double> scale = std::nullopt, const at::Tensor& doc = {});

// Plain matmul-softmax version of the same function, for tests.
at::Tensor causal_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                std::optional<double> scale = std::nullopt, const at::Tensor& doc = {});

// Boolean mask, true where a query may read a key: [T, S], or [B, T, S] with document ids doc [B, S].
at::Tensor causal_mask(int64_t t, int64_t s, int64_t window, const at::Device& device, const at::Tensor& doc = {});

}  // namespace slm::ops
