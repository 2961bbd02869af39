#include "slm/model/decode_state.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

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

std::unique_ptr<LayerCache> TokenCache::view_rows(int64_t begin, int64_t count) {
  auto v = std::make_unique<TokenCache>(capacity_, max_rollback_);
  for (const auto& s : streams_) v->streams_.push_back({s.storage.narrow(0, begin, count), s.time_dim});
  if (positions_.defined()) v->positions_ = positions_.narrow(0, begin, count);
  v->length_ = length_;
  return v;
}

void TokenCache::copy_rows(const LayerCache& src, int64_t src_row, int64_t dst_row, int64_t rows, int64_t tokens) {
  const auto* from = dynamic_cast<const TokenCache*>(&src);
  if (!from || from->streams_.size() != streams_.size())
    throw Error("attention cache: copy_rows from a cache of another layer");
  if (tokens < 0 || tokens > capacity_ || tokens > from->capacity_)
    throw Error("attention cache: cannot copy " + std::to_string(tokens) + " tokens into a capacity of " +
                std::to_string(capacity_));
  for (size_t i = 0; i < streams_.size(); ++i) {
    const auto &d = streams_[i], &f = from->streams_[i];
    if (rows < 1 || src_row < 0 || src_row + rows > f.storage.size(0) || dst_row < 0 ||
        dst_row + rows > d.storage.size(0))
      throw Error("attention cache: copy_rows of rows outside the batch");
    d.storage.narrow(0, dst_row, rows)
        .narrow(d.time_dim, 0, tokens)
        .copy_(f.storage.narrow(0, src_row, rows).narrow(f.time_dim, 0, tokens));
  }
}

void TokenCache::collect_tensors(std::vector<torch::Tensor>& out) const {
  for (const auto& s : streams_) out.push_back(s.storage);
  if (positions_.defined()) out.push_back(positions_);
}

int64_t TokenCache::elements_per_token() const {
  int64_t n = 0;
  for (const auto& s : streams_) n += s.storage.numel() / (capacity_ * s.storage.size(0));
  return n;
}

void DecodeState::collect_tensors(std::vector<torch::Tensor>& out) const {
  for (const auto& c : layers)
    if (c) c->collect_tensors(out);
  for (const auto* t : {&tokens, &hidden, &positions})
    if (t->defined()) out.push_back(*t);
  for (const auto& m : mtp) {
    for (const auto& c : m.layers)
      if (c) c->collect_tensors(out);
    if (m.hidden.defined()) out.push_back(m.hidden);
  }
}

int64_t DecodeState::bytes() const {
  std::vector<torch::Tensor> t;
  collect_tensors(t);
  return distinct_storage_bytes(t);
}

int64_t distinct_storage_bytes(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const auto& s = t.storage();
    if (seen.insert(s.unsafeGetStorageImpl()).second) n += static_cast<int64_t>(s.nbytes());
  }
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
  if (positions.defined()) positions.sub_(n);
  length -= n;
  for (size_t k = 1; k <= mtp.size(); ++k) {
    auto& m = mtp[k - 1];
    const int64_t settled = std::min(m.length, std::max<int64_t>(0, length - static_cast<int64_t>(k)));
    for (auto& c : m.layers)
      if (c) c->rollback(m.length - settled);
    m.length = settled;
  }
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

namespace slm::model {

DecodeState DecodeState::view_rows(int64_t begin, int64_t count) {
  if (begin < 0 || count < 1 || begin + count > batch())
    throw Error("decode state: rows " + std::to_string(begin) + ".." + std::to_string(begin + count - 1) +
                " are outside its batch of " + std::to_string(batch()));
  DecodeState v;
  for (auto& c : layers) v.layers.push_back(c ? c->view_rows(begin, count) : nullptr);
  v.tokens = tokens.narrow(0, begin, count);
  if (hidden.defined()) v.hidden = hidden.narrow(0, begin, count);
  if (positions.defined()) v.positions = positions.narrow(0, begin, count);
  v.length = length;
  v.max_rollback = max_rollback;
  return v;
}

void DecodeState::copy_rows(const DecodeState& src, int64_t src_row, int64_t dst_row, int64_t rows, int64_t n) {
  if (src.layers.size() != layers.size()) throw Error("decode state: copy_rows from a state of another model");
  if (rows < 1 || src_row < 0 || src_row + rows > src.batch() || dst_row < 0 || dst_row + rows > batch())
    throw Error("decode state: copy_rows of rows outside the batch");
  if (n < 0 || n > src.capacity() || n > capacity())
    throw Error("decode state: cannot copy " + std::to_string(n) + " tokens into a capacity of " +
                std::to_string(capacity()));
  for (size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l] != !src.layers[l]) throw Error("decode state: copy_rows from a state of another model");
    if (layers[l]) layers[l]->copy_rows(*src.layers[l], src_row, dst_row, rows, n);
  }
  tokens.narrow(0, dst_row, rows).narrow(1, 0, n).copy_(src.tokens.narrow(0, src_row, rows).narrow(1, 0, n));
  if (hidden.defined() && src.hidden.defined())
    hidden.narrow(0, dst_row, rows).narrow(1, 0, n).copy_(src.hidden.narrow(0, src_row, rows).narrow(1, 0, n));
  if (positions.defined()) positions.narrow(0, dst_row, rows).fill_(n);
  mtp.clear();
}

}  // namespace slm::model
