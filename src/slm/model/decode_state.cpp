#include "slm/model/decode_state.h"

#include <torch/torch.h>

#include "slm/util/error.h"

namespace slm::model {

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
                 const torch::TensorOptions& options)
    : keys_(torch::zeros({batch, kv_heads, capacity, head_dim}, options)),
      values_(torch::zeros({batch, kv_heads, capacity, head_dim}, options)) {}

void KVCache::rollback(int64_t n) { length_ -= n; }

std::pair<torch::Tensor, torch::Tensor> KVCache::append(const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t t = k.size(2);
  if (length_ + t > capacity())
    throw Error("KV cache is full: " + std::to_string(length_) + " + " + std::to_string(t) + " tokens exceed capacity " +
                std::to_string(capacity()));
  keys_.narrow(2, length_, t).copy_(k);
  values_.narrow(2, length_, t).copy_(v);
  length_ += t;
  return {keys_.narrow(2, 0, length_), values_.narrow(2, 0, length_)};
}

void DecodeState::rollback(int64_t n) {
  if (n < 0 || n > length)
    throw Error("cannot roll back " + std::to_string(n) + " tokens: the state holds " + std::to_string(length));
  if (n > max_rollback)
    throw Error("cannot roll back " + std::to_string(n) + " tokens: the state was created with max_rollback " +
                std::to_string(max_rollback));
  for (auto& c : layers)
    if (c) c->rollback(n);
  length -= n;
}

void DecodeState::push(const torch::Tensor& new_tokens, const torch::Tensor& new_hidden) {
  const int64_t t = new_tokens.size(1);
  if (length + t > capacity())
    throw Error("decode state is full: " + std::to_string(length) + " + " + std::to_string(t) +
                " tokens exceed capacity " + std::to_string(capacity()));
  tokens.narrow(1, length, t).copy_(new_tokens);
  if (hidden.defined()) hidden.narrow(1, length, t).copy_(new_hidden);
  length += t;
}

}  // namespace slm::model
