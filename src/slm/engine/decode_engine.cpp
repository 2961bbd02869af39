#include "slm/engine/decode_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "slm/engine/generation.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/sampler.h"

namespace slm::engine {

namespace {

struct Job {
  RequestId id = 0;
  Request request;
  Callbacks callbacks;
  std::atomic<bool> cancelled{false};
};

class DecodeEngine final : public Engine {
 public:
  DecodeEngine(std::vector<EngineModel> models, DecodeEngineOptions o)
      : models_(std::move(models)), options_(std::move(o)) {
    vocab_ = models_[0].model->recipe().vocab_size;
    context_ = options_.context_length;
    for (const auto& m : models_) {
      if (!m.model || !m.in_use) throw Error("engine: no model");
      if (m.model->recipe().vocab_size != vocab_)
        throw Error("engine: a mixture needs one vocabulary; " + m.model->recipe().name + " has " +
                    std::to_string(m.model->recipe().vocab_size) + " ids, " + models_[0].model->recipe().name + " " +
                    std::to_string(vocab_));
      if (options_.context_length <= 0)
        context_ = context_ > 0 ? std::min<int64_t>(context_, m.model->recipe().seq_len) : m.model->recipe().seq_len;
    }
    banned_ = torch::zeros({vocab_}, torch::kBool);
    for (int64_t id : options_.banned_ids) {
      if (id < 0 || id >= vocab_) throw Error("engine: banned id " + std::to_string(id) + " is outside the vocabulary");
      banned_[id] = true;
    }
    worker_ = std::thread([this] { run(); });
  }

  ~DecodeEngine() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      for (auto& [id, job] : jobs_) job->cancelled = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  RequestId submit(Request r, Callbacks cb) override {
    const auto n = static_cast<int64_t>(r.prompt.size());
    if (n == 0) throw Error("the prompt must hold at least one token");
    if (r.max_tokens < 1) throw Error("max_tokens must be at least 1");
    if (n + r.max_tokens > context_)
      throw Error("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" + std::to_string(r.max_tokens) +
                  ") exceeds the model's context of " + std::to_string(context_) + " tokens");
    for (int64_t id : r.prompt)
      if (id < 0 || id >= vocab_) throw Error("prompt token " + std::to_string(id) + " is outside the vocabulary");
    model::Sampler check({r.sampling.temperature, r.sampling.top_k, r.sampling.top_p, r.sampling.seed});
    if (!r.mixture_weights.empty()) {
      if (r.mixture_weights.size() != models_.size())
        throw Error("mixture_weights has " + std::to_string(r.mixture_weights.size()) + " entries for " +
                    std::to_string(models_.size()) + " models");
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

  void cancel(RequestId id) override {
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

  Stats stats() const override {
    std::lock_guard lock(mu_);
    return {static_cast<int64_t>(queue_.size()), running_};
  }

  int64_t context_length() const override { return context_; }
  int64_t vocab_size() const override { return vocab_; }

 private:
  void run() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        job = queue_.front();
        queue_.pop_front();
        running_ = 1;
      }
      const Result result = execute(*job);
      {
        std::lock_guard lock(mu_);
        running_ = 0;
        jobs_.erase(job->id);
      }
      if (job->callbacks.on_done) job->callbacks.on_done(result);
    }
  }

  Result execute(Job& job) {
    const Request& r = job.request;
    Result res;
    res.prompt_tokens = static_cast<int64_t>(r.prompt.size());
    if (job.cancelled) {
      res.finish = Finish::kCancelled;
      return res;
    }
    engine::GenerationOptions go;
    go.max_tokens = r.max_tokens;
    go.sampling = {r.sampling.temperature, r.sampling.top_k, r.sampling.top_p, r.sampling.seed};
    go.banned = banned_;
    bool stopped = false;
    std::vector<MixtureMember> members;
    for (size_t i = 0; i < models_.size(); ++i)
      members.push_back({models_[i].model.get(), r.mixture_weights.empty() ? 1.0 : r.mixture_weights[i]});
    // Every model's turn, taken in one global order (by address) so that two engines never wait on each other.
    std::vector<std::mutex*> turns;
    for (const auto& m : models_) turns.push_back(m.in_use.get());
    std::sort(turns.begin(), turns.end());
    turns.erase(std::unique(turns.begin(), turns.end()), turns.end());
    std::vector<std::unique_lock<std::mutex>> held;
    for (auto* t : turns) held.emplace_back(*t);
    try {
      engine::generate_mixture(members, r.prompt, go, [&](int64_t id) {
        if (job.cancelled) return false;
        if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end()) {
          stopped = true;
          return false;
        }
        ++res.completion_tokens;
        if (job.callbacks.on_token) job.callbacks.on_token(id);
        return true;
      });
      res.finish = job.cancelled ? Finish::kCancelled : stopped ? Finish::kStop : Finish::kLength;
    } catch (const std::exception& e) {
      res.finish = Finish::kError;
      res.error = e.what();
    }
    return res;
  }

  std::vector<EngineModel> models_;
  DecodeEngineOptions options_;
  int64_t vocab_ = 0, context_ = 0;
  torch::Tensor banned_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<RequestId, std::shared_ptr<Job>> jobs_;  // queued or running
  RequestId next_id_ = 0;
  int64_t running_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Engine> make_decode_engine(std::shared_ptr<model::HybridLM> model, DecodeEngineOptions options) {
  return make_decode_engine(EngineModel{std::move(model)}, std::move(options));
}

std::unique_ptr<Engine> make_decode_engine(EngineModel model, DecodeEngineOptions options) {
  if (!model.model) throw Error("engine: no model");
  return std::make_unique<DecodeEngine>(std::vector<EngineModel>{std::move(model)}, std::move(options));
}

std::unique_ptr<Engine> make_mixture_engine(std::vector<EngineModel> models, DecodeEngineOptions options) {
  if (models.size() < 2) throw Error("engine: a mixture needs at least two models");
  return std::make_unique<DecodeEngine>(std::move(models), std::move(options));
}

}  // namespace slm::engine
