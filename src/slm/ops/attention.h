#pragma once
// Causal (optionally sliding-window) attention over a query block that ends the key sequence.
//   q [B, H, T, hd], k [B, KV, S, hd], v [B, KV, S, dv] with S >= T: query i sits at position S - T + i.
//   Grouped-query: H % KV == 0, query head h reads kv head h / (H / KV).
//   window > 0: a query at position p sees keys p - window + 1 .. p (window tokens, itself included);
//   window == 0: every earlier key.
//   scale multiplies the scores; 1/sqrt(hd) when absent (MLA's absorbed form scores in a wider space).
//   docs (optional, packed training rows, T == S): a query reads only keys of its own document.
#include <ATen/core/Tensor.h>

#include <optional>

namespace slm::ops {

// Documents packed into rows, as attention reads them: the document id of every position [B, S] (the masks) and,
// for the flash kernel's variable-length form, the documents' starts in the flattened B·S tokens followed by B·S
// (cu_seqlens, int32; undefined: not known, the masked form runs) and the longest document's length.
struct PackedSpans {
  at::Tensor id;
  at::Tensor cu_seqlens;
  int64_t max_len = 0;
};

// On CUDA in BF16/FP16 with T == S, windows or packed documents run flash attention's variable-length form
// (at::_flash_attention_forward, autograd included: no [T, S] mask is built); otherwise
// at::scaled_dot_product_attention, with an explicit mask only where is_causal cannot express it.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                            std::optional<double> scale = std::nullopt, const PackedSpans* docs = nullptr);

// Plain matmul-softmax version of the same function, for tests.
at::Tensor causal_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                                std::optional<double> scale = std::nullopt, const PackedSpans* docs = nullptr);

// Boolean mask, true where a query may read a key: [T, S], or [B, T, S] with document ids doc [B, S].
at::Tensor causal_mask(int64_t t, int64_t s, int64_t window, const at::Device& device, const at::Tensor& doc = {});

}  // namespace slm::ops
