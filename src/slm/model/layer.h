#pragma once
// The surface every layer family implements (see docs/architecture.md). A layer owns its pre-norm
// ("norm") and returns what is added to the residual stream: x + layer(x).
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "slm/model/documents.h"
#include "slm/model/modules.h"
#include "slm/recipe/letters.h"

namespace slm::model {

// One layer's inference cache (KV for attention, the recurrent state for Mamba-3 and M2RNN; none for channel
// layers). Rollback is in place so a speculative decoder can drop rejected tokens without moving the cache off the
// device.
class LayerCache {
 public:
  virtual ~LayerCache() = default;
  virtual int64_t length() const = 0;    // tokens held
  virtual void rollback(int64_t n) = 0;  // forget the last n tokens (n <= length, checked by DecodeState)
  // Moves the token counter by n and nothing else: a replayed CUDA graph advanced the tensors without running the
  // host code that counts (n > 0), or a capture ran that code without advancing them (n < 0).
  virtual void shift_length(int64_t n) = 0;
  // Continuous batching (engine/batch_engine.h) keeps each sequence in one row of a pooled cache and steps a
  // leading run of rows at a time through these two.
  // A cache over rows [begin, begin + count) of this one that shares its memory (what a step writes through the view
  // lands here) and starts with the same counters. It never replaces a buffer, so it stays valid as long as this
  // cache's buffers do.
  virtual std::unique_ptr<LayerCache> view_rows(int64_t begin, int64_t count) = 0;
  // Copies the first `tokens` tokens (a token cache) or the state (a recurrent cache) of rows [src_row, src_row +
  // rows) of src, a cache the same layer made (any batch and capacity), into rows [dst_row, dst_row + rows) of this
  // one, one copy per buffer whatever `rows` is; the counters do not move. Throws slm::Error for a cache of another
  // kind or rows, tokens out of range.
  virtual void copy_rows(const LayerCache& src, int64_t src_row, int64_t dst_row, int64_t rows, int64_t tokens) = 0;
  // Appends every tensor the cache holds (buffers, rollback history), for the memory it keeps (DecodeState::bytes).
  virtual void collect_tensors(std::vector<torch::Tensor>& out) const = 0;
};

// What a layer's decode step can do, asked by the engine (engine/batch_engine.h, engine/graph_decoder.h) instead of
// read off the layer's fields. Each entry is empty where the layer can, else the one message that says why not.
struct DecodeSupport {
  std::string batched_rows;  // rows of one pooled cache at different lengths in one step (continuous batching)
  std::string cuda_graph;    // a step captured once and replayed: nothing read back to the host while it runs
};

class Layer : public torch::nn::Module {
 public:
  Layer(int64_t d_model, double eps, const torch::TensorOptions& options);
  virtual Family family() const = 0;
  char letter() const { return pattern_letter(family()).letter; }
  virtual const char* class_name() const = 0;
  // Asked when the engine is built; a layer whose answer changes with a stage (DSA warm-up) is asked again then.
  virtual DecodeSupport decode_support() const { return {}; }

  // Training / evaluation over whole sequences, x [B, T, D], positions 0..T-1; docs (optional) marks the
  // documents packed into each row, each of which the layer runs as if it were alone (documents.h).
  torch::Tensor forward(const torch::Tensor& x, const Documents* docs = nullptr) {
    return forward_normed(norm(x), docs);
  }
  // The same from h = norm(x), which the trunk computes with the residual mix in one kernel (ops::residual_mix_norm).
  virtual torch::Tensor forward_normed(const torch::Tensor& h, const Documents* docs = nullptr) = 0;
  // x [B, T, D] continues the sequence held by cache (positions cache.length()..), extending the cache.
  // Stateless layers (channel mixers) get a null cache.
  virtual torch::Tensor prefill(const torch::Tensor& x, LayerCache* cache) = 0;
  // One token, x [B, 1, D]. Recurrent layers override this with their step form.
  virtual torch::Tensor decode(const torch::Tensor& x, LayerCache* cache) { return prefill(x, cache); }
  // Preallocated cache for batch sequences of up to capacity tokens; nullptr for stateless layers.
  virtual std::unique_ptr<LayerCache> make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const = 0;

  RMSNorm norm{nullptr};
};

}  // namespace slm::model
