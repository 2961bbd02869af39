#pragma once
// DeepSeek sparse attention (DSA, DeepSeek-V3.2) for A layers: the lightning indexer scores every earlier key
// for each query, the top-k keys plus the local window are kept, and the main attention (GQA or MLA) reads only
// those. The indexer trains on a KL term against the main attention's distribution (see DsaStage).
//
//   indexer query  q_{t,j} = RoPE(Wq h_t)_j               (H_I heads of d_I; RoPE on the first half of d_I)
//   indexer key    k_s     = RoPE(LayerNorm(Wk h_s))      (one key per token, shared by every indexer head)
//   head weights   w_{t,j} = (Ww h_t)_j / sqrt(H_I * d_I)
//   score          I[t,s]  = sum_j w_{t,j} * ReLU(q_{t,j} . k_s)       (s visible from t)
//
// A query at position p that sees n keys (p + 1, or the layer's window) keeps
//   k(p) = min(n, max(floor(dsa_top_k_ratio * n), dsa_local_window))
// keys: the last dsa_local_window of them always, the rest by score (ties to the earlier position). k depends
// on the position, not on the chunk, so prefill and decode select the same keys.
#include "slm/model/decode_state.h"
#include "slm/model/layers/rope.h"
#include "slm/model/modules.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

// Warmup: the main attention is dense and the indexer learns KL(attention || indexer) over every visible key
// (the trainer freezes everything else). Sparse: the main attention reads the selected keys and the KL is taken
// over them. In both stages the indexer's input is detached, so the KL trains the indexer only and the LM loss
// never reaches it.
enum class DsaStage { Warmup, Sparse };

int64_t dsa_keys_per_query(int64_t visible, double ratio, int64_t local_window);

// Selection from indexer scores [B, T, S] of queries at positions S-T..S-1: key positions [B, T, K] sorted by
// score (the local window first), -1 in the slots beyond a query's k(p). No gradient. With document ids doc [B, S]
// (packed rows) a query sees only its own document's keys, and k(p) counts those.
torch::Tensor dsa_select(const torch::Tensor& scores, double ratio, int64_t local_window, int64_t window,
                         const torch::Tensor& doc = {});

// dsa_select for one decode query per row over a cache's whole capacity: scores [B, 1, S] of the query at
// position[b] (int64 [B] on the device) against keys 0..S-1, of which those past the position are not visible.
// Returns [B, 1, K] with K = k(p) of the widest window (the capacity or the layer's window), -1 past a row's own
// k(p): the keys dsa_select picks for that query, in its order. Reads nothing on the host (a CUDA graph can replay
// it at any position). No documents.
torch::Tensor dsa_select_at(const torch::Tensor& scores, const torch::Tensor& position, double ratio,
                            int64_t local_window, int64_t window);

// sum_t KL(target_t || softmax(logits_t)) / rows, over the last dim: target rows sum to 1 (zeros allowed),
// logits are -inf exactly where the target is not defined. The DSA indexer loss.
torch::Tensor dsa_kl(const torch::Tensor& target, const torch::Tensor& logits);

// LayerNorm over the last dim with "weight" and "bias" made with the caller's options (torch::nn::LayerNorm
// allocates on the CPU, and parameters cannot be moved onto the meta device afterwards).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

class DsaIndexerImpl : public torch::nn::Module {
 public:
  DsaIndexerImpl(const Recipe& recipe, int64_t window, const torch::TensorOptions& options);
  // Keys [B, T, d_I] of h [B, T, D] at rotary positions pos (rope.h positions()).
  torch::Tensor keys(const torch::Tensor& h, const RotaryPositions& pos);
  // Scores [B, T, S] of queries h [B, T, D] (at rotary positions pos) against keys [B, S, d_I]; not masked.
  torch::Tensor scores(const torch::Tensor& h, const torch::Tensor& keys, const RotaryPositions& pos);

  // The main attention of a DSA layer for the core's q [B, H, T, dk], k [B, KV, S, dk], v [B, KV, S, dv]
  // (queries at S-T..), given the normalised layer input h [B, T, D]. With a cache, the indexer keys of h are
  // written to its stream `slot` (the caller advances the cache). In training mode the KL term is kept for
  // loss(). docs (without a cache): packed documents, each attended alone.
  torch::Tensor attend(const torch::Tensor& h, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       double scale, TokenCache* cache, int slot, const Documents* docs = nullptr);
  // The Sparse stage's decode step of attend, one token per row at the cache's device positions: q [B, H, 1, dk],
  // keys and values the cache's whole storage [B, KV, capacity, d]; selects with dsa_select_at, so no host read.
  torch::Tensor attend_step(const torch::Tensor& h, const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, double scale, TokenCache& cache, int slot);
  // The indexer KL of the last training-mode attend (undefined before one).
  const torch::Tensor& loss() const { return loss_; }
  // The cache stream of the indexer keys, [B, capacity, d_I].
  int add_stream(TokenCache& cache, int64_t batch) const;

  int64_t heads, dim, rope_dims, local_window, window;
  double ratio;
  DsaStage stage = DsaStage::Sparse;
  Linear wq{nullptr}, wk{nullptr}, weights_proj{nullptr};
  LayerNorm k_norm{nullptr};

 private:
  torch::Tensor rotate(const torch::Tensor& x, const RotaryPositions& pos) const;  // RoPE on the first rope_dims
  Rope rope_;
  torch::Tensor loss_;
};
TORCH_MODULE(DsaIndexer);

}  // namespace slm::model
