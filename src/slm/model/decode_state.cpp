#include "slm/model/decode_state.h"

#include <torch/torch.h>

#include "slm/util/error.h"

namespace slm::model {

int TokenCache::add_stream(torch::Tensor storage, int64_t time_dim) {
  if (storage.size(time_dim) != capacity_)
    throw Error("TokenCache: a stream of " + std::to_string(storage.size(time_dim)) +
                " entries along its time dim does not match the capacity " + std::to_string(capacity_));
  streams_.push_back({std::move(storage), time_dim});
  return static_cast<int>(streams_.size()) - 1;
}

torch::Tensor TokenCache::write(int slot, const torch::Tensor& x) {
  const auto& s = streams_.at(slot);
  const int64_t t = x.size(s.time_dim);
  if (length_ + t > capacity_)
    throw Error("KV cache is full: " + std::to_string(length_) + " + " + std::to_string(t) +
                " tokens exceed capacity " + std::to_string(capacity_));
  s.storage.narrow(s.time_dim, length_, t).copy_(x);
  return s.storage.narrow(s.time_dim, 0, length_ + t);
}

torch::Tensor TokenCache::write_step(int slot, const torch::Tensor& x) {
  const auto& s = streams_.at(slot);
  if (x.size(s.time_dim) != 1) throw Error("TokenCache::write_step writes one token per row");
  if (length_ + 1 > capacity_)
    throw Error("KV cache is full: " + std::to_string(length_) + " + 1 tokens exceed capacity " +
                std::to_string(capacity_));
  if (!positions_.defined()) throw Error("TokenCache::write_step: the cache has no device positions");
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = x.size(0);
  s.storage.scatter_(s.time_dim, positions_.view(shape).expand(x.sizes()), x);
  return s.storage;
}

void TokenCache::advance(int64_t t) {
  length_ += t;
}

void TokenCache::rollback(int64_t n) {
  if (n < 0 || n > length_ || n > max_rollback_)
    throw Error("attention cache: cannot roll back " + std::to_string(n) + " tokens (it holds " +
                std::to_string(length_) + ", max_rollback " + std::to_string(max_rollback_) + ")");
  length_ -= n;
}

int64_t TokenCache::elements_per_token() const {
  int64_t n = 0;
  for (const auto& s : streams_) n += s.storage.numel() / (capacity_ * s.storage.size(0));
  return n;
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
  if (t == 1 && positions.defined()) {
    auto at = positions.view({-1, 1});
    tokens.scatter_(1, at, new_tokens);
    if (hidden.defined()) hidden.scatter_(1, at.unsqueeze(2).expand(new_hidden.sizes()), new_hidden);
  } else {
    tokens.narrow(1, length, t).copy_(new_tokens);
    if (hidden.defined()) hidden.narrow(1, length, t).copy_(new_hidden);
  }
  if (positions.defined()) positions.add_(t);
  length += t;
}

void DecodeState::shift_length(int64_t n) {
  for (auto& c : layers)
    if (c) c->shift_length(n);
  length += n;
}

}  // namespace slm::model
