#pragma once
// Inference state: one cache per layer plus the token / hidden history MTP drafting reads, and the MTP modules' own
// caches. Every tensor is preallocated to a capacity and filled up to a length counter, so rollback only moves
// counters.
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "slm/model/layer.h"

namespace slm::model {

// The per-token tensors of one attention layer: keys and values (GQA), latents and RoPE keys (MLA), the DSA
// indexer's keys. Each stream is preallocated with the capacity along its time dim; rollback only moves the
// counter. positions (DecodeState::positions, shared by every layer) holds each row's count on the device, which a
// decode step writes and attends by: the host's length is the same for every row, the positions are per row (rows of
// a continuous-batching pool hold sequences of different lengths) and a step that must not read the host (a CUDA
// graph) needs no host value.
class TokenCache : public LayerCache {
 public:
  TokenCache(int64_t capacity, int64_t max_rollback) : capacity_(capacity), max_rollback_(max_rollback) {}
  // Adds a stream stored in `storage` (capacity entries along time_dim) and returns its slot.
  int add_stream(torch::Tensor storage, int64_t time_dim);
  int64_t length() const override { return length_; }
  int64_t capacity() const { return capacity_; }
  // Throws slm::Error beyond length() or the max_rollback the cache was made with.
  void rollback(int64_t n) override;
  // Writes x (T entries along the stream's time dim) to slot at length()..length()+T-1 and returns a view of
  // every entry through that chunk. A forward writes each of its streams once and then calls advance(T).
  torch::Tensor write(int slot, const torch::Tensor& x);
  // One token: writes x (1 entry along the time dim) of row b at positions()[b] and returns the whole storage;
  // the positions stay on the device.
  torch::Tensor write_step(int slot, const torch::Tensor& x);
  void advance(int64_t t);
  void shift_length(int64_t n) override { length_ += n; }
  std::unique_ptr<LayerCache> view_rows(int64_t begin, int64_t count) override;
  void copy_rows(const LayerCache& src, int64_t src_row, int64_t dst_row, int64_t rows, int64_t tokens) override;
  void collect_tensors(std::vector<torch::Tensor>& out) const override;
  void set_positions(torch::Tensor positions) { positions_ = std::move(positions); }
  const torch::Tensor& positions() const { return positions_; }
  // Elements stored per token and sequence over all streams (the KV-cache footprint of the layer).
  int64_t elements_per_token() const;

 private:
  struct Stream {
    torch::Tensor storage;
    int64_t time_dim;
  };
  std::vector<Stream> streams_;
  torch::Tensor positions_;
  int64_t capacity_, max_rollback_, length_ = 0;
};

// The inference state of MTP module k (1-based; HybridLM::draft): its layers' caches and its outputs h^k, over the
// positions whose inputs the decode state holds. Position i reads t_{i+k}, so with n tokens held positions
// 0..n-k-1 are settled; a draft runs the ones past length and the k speculative ones after them (which read the
// next token and earlier drafts), then rolls its caches back over the speculative ones.
struct MtpCache {
  std::vector<std::unique_ptr<LayerCache>> layers;  // the module's layers, null for stateless ones
  torch::Tensor hidden;  // [B, capacity, D] h^k before the module's norm, by position: module k+1's input
  int64_t length = 0;    // settled positions
};

struct DecodeState {
  std::vector<std::unique_ptr<LayerCache>> layers;  // main stack, null for stateless layers
  torch::Tensor tokens;                             // [B, capacity] tokens consumed
  torch::Tensor hidden;                             // [B, capacity, D] last hidden (pre final norm); MTP only
  torch::Tensor positions;                          // [B] int64 on the model's device: tokens consumed per row
                                                    // (length, kept on the device by every push)
  int64_t length = 0;                               // tokens consumed
  int64_t max_rollback = 0;                         // how far rollback may reach back (recurrent layers keep
                                                    // this many old states)
  // One per MTP module, made by the first HybridLM::draft (empty until then, and again after copy_row into this
  // state, which changes rows' histories under it; a draft rebuilds it from the history).
  std::vector<MtpCache> mtp;
  int64_t batch() const { return tokens.size(0); }
  int64_t capacity() const { return tokens.size(1); }
  // Forgets the last n tokens in every cache (the MTP caches keep the positions still settled); throws slm::Error
  // when n exceeds length or max_rollback.
  void rollback(int64_t n);
  // Records tokens [B, T] and (when MTP is on) hidden [B, T, D] at length.., then advances length and positions.
  // One token is written at positions on the device, so a captured decode step stays right when replayed.
  void push(const torch::Tensor& new_tokens, const torch::Tensor& new_hidden);
  // Moves every counter by n (LayerCache::shift_length): for the driver of a CUDA graph of a decode step.
  void shift_length(int64_t n);
  // Rows [begin, begin + count) as a state of their own that shares this one's memory (LayerCache::view_rows),
  // with the same counters and no MTP cache.
  DecodeState view_rows(int64_t begin, int64_t count);
  // Rows [src_row, src_row + rows) of src (a state of the same model, each `tokens` <= src.capacity() tokens long)
  // into rows [dst_row, dst_row + rows) of this one: every cache (LayerCache::copy_rows), the token and hidden
  // history, and positions of those rows = tokens. One copy per buffer, whatever `rows` is. Drops this state's MTP
  // cache.
  void copy_rows(const DecodeState& src, int64_t src_row, int64_t dst_row, int64_t rows, int64_t tokens);
  void copy_row(const DecodeState& src, int64_t src_row, int64_t dst_row, int64_t tokens) {
    copy_rows(src, src_row, dst_row, 1, tokens);
  }
  // Appends every tensor the state holds: the caches', the histories, the MTP caches.
  void collect_tensors(std::vector<torch::Tensor>& out) const;
  // The memory the state keeps alive: the bytes of each distinct storage under its tensors (a view of another state
  // counts that state's whole buffers; the positions every attention cache shares count once).
  int64_t bytes() const;
};

// The bytes of the distinct storages under tensors (each counted once however many tensors view it).
int64_t distinct_storage_bytes(const std::vector<torch::Tensor>& tensors);

}  // namespace slm::model
