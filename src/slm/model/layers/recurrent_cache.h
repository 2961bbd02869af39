#pragma once
// The inference cache of a recurrent layer (M, R): its state after the tokens consumed so far, plus the
// states before each of the last max_rollback tokens so a speculative decoder can drop rejected tokens.
// A recurrent state cannot be rewound, so the layers run the recurrence of the last max_rollback tokens of a prefill
// one token at a time and record the state before each (Mamba-3 and M2RNN with their projections batched over those
// tokens); a multi-token advance clears that history.
// The state's buffers keep their addresses: a State is a struct of tensors whose tensors() lists pointers to them, and
// every new state is copied into the current buffers (a captured CUDA graph of a decode step reads and writes them
// where they were at capture). A buffer is replaced only when the new tensor's shape or dtype differs (the first step
// after a zero state of another dtype).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "slm/model/layer.h"
#include "slm/util/error.h"

namespace slm::model {

template <class State>
class RecurrentCache : public LayerCache {
 public:
  RecurrentCache(State zero, int64_t max_rollback) : state_(std::move(zero)), max_rollback_(max_rollback) {}
  int64_t length() const override { return length_; }
  int64_t max_rollback() const { return max_rollback_; }
  const State& state() const { return state_; }

  // next is the state after `tokens` more tokens.
  void advance(State next, int64_t tokens) {
    if (tokens == 1 && max_rollback_ > 0) {
      history_.push_back(clone(state_));
      if (static_cast<int64_t>(history_.size()) > max_rollback_) history_.pop_front();
    } else {
      history_.clear();
    }
    assign(state_, next);
    length_ += tokens;
  }

  void shift_length(int64_t n) override { length_ += n; }

  std::unique_ptr<LayerCache> view_rows(int64_t begin, int64_t count) override {
    auto rows = [&](State s) {
      for (at::Tensor* t : s.tensors())
        if (t->defined()) *t = t->narrow(0, begin, count);
      return s;
    };
    auto v = std::make_unique<RecurrentCache>(rows(state_), max_rollback_);
    for (auto& h : history_) v->history_.push_back(rows(h));
    v->length_ = length_;
    v->view_ = true;
    return v;
  }

  void copy_rows(const LayerCache& src, int64_t src_row, int64_t dst_row, int64_t rows, int64_t) override {
    const auto* from = dynamic_cast<const RecurrentCache*>(&src);
    if (!from) throw Error("recurrent layer cache: copy_rows from a cache of another layer");
    State s = from->state_;
    auto d = state_.tensors();
    auto f = s.tensors();
    for (size_t i = 0; i < d.size(); ++i) {
      if (d[i]->defined() != f[i]->defined()) throw Error("recurrent layer cache: copy_rows between unlike states");
      if (!d[i]->defined()) continue;
      if (rows < 1 || src_row < 0 || src_row + rows > f[i]->size(0) || dst_row < 0 || dst_row + rows > d[i]->size(0))
        throw Error("recurrent layer cache: copy_rows of rows outside the batch");
      d[i]->narrow(0, dst_row, rows).copy_(f[i]->narrow(0, src_row, rows));
    }
  }

  void collect_tensors(std::vector<at::Tensor>& out) const override {
    auto add = [&](State s) {
      for (at::Tensor* t : s.tensors())
        if (t->defined()) out.push_back(*t);
    };
    add(state_);
    for (const auto& h : history_) add(h);
  }

  void rollback(int64_t n) override {
    if (n == 0) return;
    const auto kept = static_cast<int64_t>(history_.size());
    if (n < 0 || n > kept)
      throw Error("recurrent layer cache: cannot roll back " + std::to_string(n) + " tokens, it holds the states of " +
                  std::to_string(kept));
    assign(state_, history_[kept - n]);
    history_.resize(kept - n);
    length_ -= n;
  }

 private:
  static State clone(State& s) {
    State c = s;
    for (at::Tensor* t : c.tensors())
      if (t->defined()) *t = t->clone();
    return c;
  }
  // A view (view_rows) always copies into its buffers, which are another cache's memory.
  void assign(State& dst, State& src) const {
    auto d = dst.tensors();
    auto s = src.tensors();
    for (size_t i = 0; i < d.size(); ++i) {
      if (d[i]->defined() && s[i]->defined() && d[i]->sizes() == s[i]->sizes() &&
          (view_ || (d[i]->scalar_type() == s[i]->scalar_type() && d[i]->device() == s[i]->device()))) {
        if (!d[i]->is_same(*s[i])) d[i]->copy_(*s[i]);
      } else if (view_) {
        throw Error("recurrent layer cache: a row view cannot take a state of another shape");
      } else {
        *d[i] = *s[i];
      }
    }
  }

  State state_;
  std::deque<State> history_;  // history_[i]: the state before token length_ - history_.size() + i
  int64_t max_rollback_;
  int64_t length_ = 0;
  bool view_ = false;
};

// Runs h [B, T, ...] through run(part, state) -> (output, next state) and advances the cache; the last max_rollback
// tokens go through steps(part, state) -> (output, the state after each token of part), so that rollback can reach
// them. Returns the outputs concatenated over T.
template <class State, class Run, class Steps>
at::Tensor run_recurrent(RecurrentCache<State>& cache, const at::Tensor& h, Run&& run, Steps&& steps) {
  const int64_t t = h.size(1), singles = std::min(t, cache.max_rollback());
  std::vector<at::Tensor> outs;
  if (t > singles) {
    auto [o, s] = run(h.narrow(1, 0, t - singles), cache.state());
    cache.advance(std::move(s), t - singles);
    outs.push_back(o);
  }
  if (singles > 0) {
    auto [o, states] = steps(h.narrow(1, t - singles, singles), cache.state());
    for (auto& s : states) cache.advance(std::move(s), 1);
    outs.push_back(o);
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 1);
}

// part [B, T, ...] one token at a time through run(token, state) -> (output, next state): the outputs concatenated
// over T and the state after each token.
template <class State, class Run>
std::pair<at::Tensor, std::vector<State>> step_each(Run&& run, const at::Tensor& part, const State& state) {
  std::vector<at::Tensor> outs;
  std::vector<State> states;
  for (int64_t i = 0; i < part.size(1); ++i) {
    auto [o, s] = run(part.narrow(1, i, 1), i ? states.back() : state);
    outs.push_back(o);
    states.push_back(std::move(s));
  }
  return {at::cat(outs, 1), std::move(states)};
}

// run_recurrent for layers without a multi-token step form: the last max_rollback tokens through run one at a time.
template <class State, class Run>
at::Tensor run_recurrent(RecurrentCache<State>& cache, const at::Tensor& h, Run&& run) {
  return run_recurrent(cache, h, run,
                       [&run](const at::Tensor& part, const State& state) { return step_each(run, part, state); });
}

}  // namespace slm::model
