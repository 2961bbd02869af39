#include "slm/engine/queued_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "slm/model/hybrid_lm.h"
#include "slm/model/sampler.h"

namespace slm::engine {

model::SamplerOptions sampler_options(const Sampling& s) {
  return {s.temperature, s.top_k, s.top_p, s.seed, s.repetition_penalty, s.presence_penalty, s.frequency_penalty};
}

std::pair<int64_t, int64_t> vocab_and_context(const std::vector<EngineModel>& models, const DecodeEngineOptions& o) {
  for (const auto& m : models)
    if (!m.model || !m.in_use) throw Error("engine: no model");
  const auto& first = models[0].model->recipe();
  int64_t context = o.context_length;
  for (const auto& m : models) {
    const auto& r = m.model->recipe();
    if (r.vocab_size != first.vocab_size)
      throw Error("engine: a mixture needs one vocabulary; " + r.name + " has " + std::to_string(r.vocab_size) +
                  " ids, " + first.name + " " + std::to_string(first.vocab_size));
    if (o.context_length <= 0) context = context > 0 ? std::min<int64_t>(context, r.seq_len) : r.seq_len;
  }
  return {first.vocab_size, context};
}

QueuedEngine::QueuedEngine(DecodeEngineOptions options, int64_t vocab, int64_t context, size_t models)
    : options_(std::move(options)), vocab_(vocab), context_(context), models_(models) {
  banned_ = torch::zeros({vocab_}, torch::kBool);
  for (int64_t id : options_.banned_ids) {
    if (id < 0 || id >= vocab_) throw Error("engine: banned id " + std::to_string(id) + " is outside the vocabulary");
    banned_[id] = true;
  }
}

QueuedEngine::~QueuedEngine() {
  stop();
}

void QueuedEngine::start() {
  worker_ = std::thread([this] { work(); });
}

void QueuedEngine::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& [id, job] : jobs_) job->cancelled = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

RequestId QueuedEngine::submit(Request r, Callbacks cb) {
  const auto n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) throw Error("the prompt must hold at least one token");
  if (r.max_tokens < 1) throw Error("max_tokens must be at least 1");
  if (r.max_tokens > context_ - n)  // not n + max_tokens > context_: max_tokens may be near 2^63 (signed overflow)
    throw Error("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" + std::to_string(r.max_tokens) +
                ") exceeds the model's context of " + std::to_string(context_) + " tokens");
  for (int64_t id : r.prompt)
    if (id < 0 || id >= vocab_) throw Error("prompt token " + std::to_string(id) + " is outside the vocabulary");
  const model::Sampler check(sampler_options(r.sampling));
  if (!r.mixture_weights.empty() && models_ > 1) {
    if (r.mixture_weights.size() != models_)
      throw Error("mixture_weights has " + std::to_string(r.mixture_weights.size()) + " entries for " +
                  std::to_string(models_) + " models");
    for (double w : r.mixture_weights)
      if (!(w > 0) || !std::isfinite(w)) throw Error("mixture weights must be positive");
  }
  auto job = std::make_shared<Job>();
  job->request = std::move(r);
  job->callbacks = std::move(cb);
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= options_.max_queue)
      throw QueueFull("the queue is full (" + std::to_string(options_.max_queue) + " requests waiting)");
    job->id = ++next_id_;
    jobs_[job->id] = job;
    queue_.push_back(job);
  }
  cv_.notify_all();
  return job->id;
}

void QueuedEngine::cancel(RequestId id) {
  std::shared_ptr<Job> waiting;  // a request that had not started ends here, at once
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    it->second->cancelled = true;
    if (auto q = std::find(queue_.begin(), queue_.end(), it->second); q != queue_.end()) {
      waiting = *q;
      queue_.erase(q);
      jobs_.erase(it);
    }
  }
  if (waiting && waiting->callbacks.on_done)
    waiting->callbacks.on_done({Finish::kCancelled, static_cast<int64_t>(waiting->request.prompt.size()), 0, ""});
}

Stats QueuedEngine::stats() const {
  std::lock_guard lock(mu_);
  return {static_cast<int64_t>(queue_.size()), running_, reused_prompt_tokens_.load(), batched_prompts_.load()};
}

bool QueuedEngine::take(size_t free, bool busy, std::vector<std::shared_ptr<Job>>& taken) {
  std::unique_lock lock(mu_);
  if (!busy) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  while (free > 0 && !queue_.empty()) {
    taken.push_back(queue_.front());
    queue_.pop_front();
    ++running_;
    --free;
  }
  return busy || !taken.empty() || !stopping_;
}

void QueuedEngine::finish(const std::shared_ptr<Job>& job, const Result& result) {
  {
    std::lock_guard lock(mu_);
    --running_;
    jobs_.erase(job->id);
  }
  if (job->callbacks.on_done) job->callbacks.on_done(result);
}

}  // namespace slm::engine
