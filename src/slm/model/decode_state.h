#pragma once
// Inference state: one cache per layer plus the token / hidden history MTP drafting reads. Every tensor is
// preallocated to a capacity and filled up to a length counter, so rollback only moves counters.
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "slm/model/layer.h"

namespace slm::model {

// Keys and values of one attention layer, [B, kv_heads, capacity, head_dim] each.
class KVCache : public LayerCache {
 public:
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, const torch::TensorOptions& options);
  int64_t length() const override { return length_; }
  int64_t capacity() const { return keys_.size(2); }
  void rollback(int64_t n) override;
  // Writes k, v [B, kv_heads, T, head_dim] at positions length()..length()+T-1 and returns views of every
  // key and value held so far.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& k, const torch::Tensor& v);

 private:
  torch::Tensor keys_, values_;
  int64_t length_ = 0;
};

struct DecodeState {
  std::vector<std::unique_ptr<LayerCache>> layers;  // main stack, null for stateless layers
  torch::Tensor tokens;                             // [B, capacity] tokens consumed
  torch::Tensor hidden;                             // [B, capacity, D] last hidden (pre final norm); MTP only
  int64_t length = 0;                               // tokens consumed
  int64_t max_rollback = 0;                         // how far rollback may reach back (recurrent layers keep
                                                    // this many old states)
  int64_t batch() const { return tokens.size(0); }
  int64_t capacity() const { return tokens.size(1); }
  // Forgets the last n tokens in every cache; throws slm::Error when n exceeds length or max_rollback.
  void rollback(int64_t n);
  // Records tokens [B, T] and (when MTP is on) hidden [B, T, D] at length.., then advances length.
  void push(const torch::Tensor& new_tokens, const torch::Tensor& new_hidden);
};

}  // namespace slm::model
