#pragma once
// What both engines of decode_engine.h share: request checks, the bounded queue, cancellation, stats, and the worker
// thread's start and stop. A subclass runs the worker loop (work()) and finishes every job it takes with finish().
#include <torch/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "slm/engine/decode_engine.h"
#include "slm/model/sampler.h"

namespace slm::engine {

struct Job {
  RequestId id = 0;
  Request request;
  Callbacks callbacks;
  std::atomic<bool> cancelled{false};
};

// A request's sampling options as the model's sampler takes them.
model::SamplerOptions sampler_options(const Sampling& s);

// The vocabulary the models share (throws slm::Error for a mixture of different ones or a missing model) and the
// context an engine over them accepts: options.context_length, or the shortest recipe seq_len.
std::pair<int64_t, int64_t> vocab_and_context(const std::vector<EngineModel>& models,
                                              const DecodeEngineOptions& options);

class QueuedEngine : public Engine {
 public:
  // vocab: the models' vocabulary; context: the longest prompt + max_tokens; models: how many models a request's
  // mixture_weights must weigh (1: none).
  QueuedEngine(DecodeEngineOptions options, int64_t vocab, int64_t context, size_t models);
  ~QueuedEngine() override;  // subclasses call stop() first in theirs

  RequestId submit(Request request, Callbacks callbacks) override;
  void cancel(RequestId id) override;
  Stats stats() const override;
  int64_t context_length() const override { return context_; }
  int64_t vocab_size() const override { return vocab_; }

 protected:
  // Starts the worker thread running work(); the subclass calls it at the end of its constructor.
  void start();
  // Marks every job cancelled, wakes the worker and joins it; work() must then return soon.
  void stop();
  virtual void work() = 0;
  // Waits until a request is queued, `busy` holds or the engine stops, then moves up to `free` queued jobs out
  // (oldest first) and adds them to the running count. Returns false when the engine stops and nothing is left.
  bool take(size_t free, bool busy, std::vector<std::shared_ptr<Job>>& taken);
  // Ends a job taken by take(): on_done with result, outside the lock.
  void finish(const std::shared_ptr<Job>& job, const Result& result);

  const DecodeEngineOptions options_;
  const int64_t vocab_, context_;
  const size_t models_;
  torch::Tensor banned_;                          // [V] bool on the CPU
  std::atomic<int64_t> reused_prompt_tokens_{0};  // Stats::reused_prompt_tokens
  std::atomic<int64_t> batched_prompts_{0};       // Stats::batched_prompts

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<RequestId, std::shared_ptr<Job>> jobs_;  // queued or running
  RequestId next_id_ = 0;
  int64_t running_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace slm::engine
