#pragma once
// Engram, hashed n-gram memory ("Conditional Memory via Scalable Lookup", arXiv 2601.07372). Beside the mixer of
// an A layer:
//   1. canonical ids x' = P(x) (the tokenizer's compression map; identity by default);
//   2. per order o and head j: mix_o(t) = XOR_{k<o} x'_{t-k}·m_k, row = mix_o(t) mod p_{o,j} + offset_{o,j}
//      (odd multipliers m_k per layer, distinct primes p per (layer, order, head), one flat table per layer;
//      positions before the sequence start hash as the id V, which no token has);
//   3. e_t = concat of the gathered rows; v = W_V e; per stream m: k_m = W_K^m e,
//      α_m = σ(signed_sqrt(<RMSNorm(h_m)·g_h, RMSNorm(k_m)·g_k> / sqrt(D)));
//   4. Ṽ_m = α_m·v;  Y = Ṽ + SiLU(DepthwiseCausalConv(RMSNorm(Ṽ)·g_c))  (kernel conv_kernel, dilation max order);
//   5. the residual streams get X += Y before the layer's block.
// Indices depend only on token ids, so a model computes them (and gathers the rows) before its first layer;
// a table may stay in host memory, with only the gathered rows copied to the model's device.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "slm/model/layer.h"
#include "slm/model/layers/recurrent_cache.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

class HybridLM;

// Odd hash multipliers of one Engram layer (max order of them), small enough that x·m cannot overflow int64
// for any x <= vocab (a fixed SplitMix64 stream seeded by the layer index).
std::vector<int64_t> engram_multipliers(int layer, int max_order, int64_t vocab);

// Depthwise causal conv over x [B, T, C] with a dilation, no bias ("conv.weight" [C, 1, kernel]).
class DilatedCausalConvImpl : public torch::nn::Module {
 public:
  DilatedCausalConvImpl(int64_t channels, int64_t kernel, int64_t dilation, const torch::TensorOptions& options);
  int64_t tail() const { return (weight.size(2) - 1) * dilation; }  // inputs carried between chunks
  // x [B, T, C] after the inputs in tail [B, tail(), C] (undefined: zeros); returns (y [B, T, C], new tail).
  // pos [B, T] (optional): positions in packed documents; inputs before a document's start read as zero.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& tail,
                                                  const torch::Tensor& pos = {});
  torch::Tensor weight;
  int64_t dilation;
};
TORCH_MODULE(DilatedCausalConv);

// RMSNorm over D of x [..., n, D] with one gain per stream ("weight" [n, D]).
class StreamNormImpl : public torch::nn::Module {
 public:
  StreamNormImpl(int64_t streams, int64_t dim, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(StreamNorm);

// What decode carries per Engram layer: the last max_order-1 canonical ids and the conv's input tail.
struct EngramState {
  torch::Tensor window;  // [B, max_order - 1] int64
  torch::Tensor tail;    // [B, conv tail, n·D]
  std::array<torch::Tensor*, 2> tensors() { return {&window, &tail}; }
};
using EngramCache = RecurrentCache<EngramState>;

// The decode cache of a layer with Engram: the layer's own cache and the Engram state, rolled back together.
class EngramLayerCache : public LayerCache {
 public:
  EngramLayerCache(std::unique_ptr<LayerCache> layer_cache, EngramState zero, int64_t max_rollback)
      : layer(std::move(layer_cache)), engram(std::move(zero), max_rollback) {}
  int64_t length() const override { return engram.length(); }
  void rollback(int64_t n) override {
    if (layer) layer->rollback(n);
    engram.rollback(n);
  }
  void shift_length(int64_t n) override {
    if (layer) layer->shift_length(n);
    engram.shift_length(n);
  }
  std::unique_ptr<LayerCache> view_rows(int64_t begin, int64_t count) override;
  void copy_rows(const LayerCache& src, int64_t src_row, int64_t dst_row, int64_t rows, int64_t tokens) override;
  void collect_tensors(std::vector<torch::Tensor>& out) const override {
    if (layer) layer->collect_tensors(out);
    engram.collect_tensors(out);
  }
  std::unique_ptr<LayerCache> layer;
  EngramCache engram;
};

class EngramImpl : public torch::nn::Module {
 public:
  // primes: this layer's table sizes, order-major then head (engram_table_primes).
  EngramImpl(const Recipe& recipe, int layer, int streams, const std::vector<long long>& primes,
             const torch::TensorOptions& options);

  // Table rows [B, T, orders·heads] (on the table's device) of canonical ids [B, T] that follow window
  // [B, max_order-1] (the ids before them; undefined: the sequence starts here). pos [B, T] (optional):
  // positions in packed documents; ids before a document's start hash as the before-the-start id V.
  torch::Tensor rows(const torch::Tensor& ids, const torch::Tensor& window, const torch::Tensor& pos = {}) const;
  // The gathered memory e [B, T, d_e] on the model's device.
  torch::Tensor lookup(const torch::Tensor& rows) const;
  // Y [B, T, n, D] for streams [B, T, n, D] and their memory e; conv_tail and pos as DilatedCausalConv.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& streams, const torch::Tensor& memory,
                                                  const torch::Tensor& conv_tail = {}, const torch::Tensor& pos = {});

  EngramState zero_state(int64_t batch) const;
  // The window after ids [B, T] follow window.
  torch::Tensor next_window(const torch::Tensor& window, const torch::Tensor& ids) const;

  // Moves the table to host memory (true) or back to the model's device (false); outputs do not change.
  void set_host_resident(bool host);
  bool host_resident() const { return host_; }

  torch::Tensor table;                // [Σ primes, embed_dim]
  torch::Tensor multipliers, primes;  // int64 buffers [max_order], [orders·heads]
  Linear wv{nullptr}, wk{nullptr};
  StreamNorm h_norm{nullptr}, k_norm{nullptr}, conv_norm{nullptr};
  DilatedCausalConv conv{nullptr};
  std::vector<int> orders;
  int64_t heads, streams, vocab, d_model;

 private:
  torch::Device device_;  // where the model (and, unless host-resident, the table) lives
  bool host_ = false;
};
TORCH_MODULE(Engram);

// Per-domain tables: every Engram layer's table (or one layer's) with its hashing (multipliers, primes) and the
// model's canonical map, as a safetensors file of its own ("layers.{i}.engram.table", ...).
void save_engram_tables(const HybridLM& model, const std::string& path, std::optional<int> layer = std::nullopt);
// Replaces the tables the file holds (any subset of the model's Engram layers). Refused, with the model left
// unchanged, when a tensor is unknown or mis-shaped or the file's canonical map differs from the model's.
void load_engram_tables(HybridLM& model, const std::string& path);

}  // namespace slm::model
