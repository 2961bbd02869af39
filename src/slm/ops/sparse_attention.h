#pragma once
// Token-level sparse attention, the main attention of DeepSeek sparse attention (DSA): every query reads only
// the keys listed for it.
//   q [B, H, T, dk], k [B, KV, S, dk], v [B, KV, S, dv]; H % KV == 0 (grouped-query; KV == 1 is MLA's
//   absorbed MQA form).
//   index [B, T, K] int64: the key positions (0..S-1) each query reads, each at most once per row; -1 marks an
//   unused slot. Every row lists at least one key (DSA always keeps the query's own position).
//   scale multiplies the scores.
#include <ATen/core/Tensor.h>

namespace slm::ops {

struct SparseAttentionOutput {
  at::Tensor out;         // [B, H, T, dv]
  at::Tensor head_probs;  // [B, T, K] probabilities summed over the heads, per slot (0 on unused slots);
                          // only when asked for (the DSA indexer's sparse-stage target)
};

// Two exact executions of the same function:
//   Gather: the listed keys and values are gathered per query (query chunks bound the memory): O(T * K) work,
//           but every query moves its own K * KV key/value rows.
//   Masked: dense SDPA with a [B, T, S] mask scattered from the index: O(T * S) work, keys shared by a tile of
//           queries.
// Auto gathers only for short query blocks (decode, speculative verification) over one shared KV head (MLA's
// absorbed form) and masks otherwise. Measured on an H200, bf16, S = 4096, k = 2048
// (bench/sparse_attention_bench.cpp): a 4096-token GQA forward 1.0 ms masked, 167 ms gathered; one decode step
// 0.08 ms masked, 0.14 ms gathered for GQA but 0.77 ms masked, 0.13 ms gathered for the MQA form.
enum class SparsePath { Auto, Gather, Masked };
SparseAttentionOutput sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& index, double scale, bool head_probs = false,
                                       SparsePath path = SparsePath::Auto);

// Plain reference for tests: dense float64 scores over every key with a mask built from the index by loops.
// Returns the output [B, H, T, dv] (float64) and the per-head probabilities [B, H, T, S] in head_probs.
SparseAttentionOutput sparse_attention_ref(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& index, double scale);

// Dense causal attention probabilities summed over the heads, [B, T, S] (no gradient): the DSA indexer's
// warm-up target. Same q/k layout, window and document rule as ops::causal_attention; computed in query chunks.
at::Tensor causal_head_probs(const at::Tensor& q, const at::Tensor& k, double scale, int64_t window,
                             const at::Tensor& doc = {});

}  // namespace slm::ops
