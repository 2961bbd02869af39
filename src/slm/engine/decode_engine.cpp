#include "slm/engine/decode_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

#include "slm/engine/batch_engine.h"
#include "slm/engine/generation.h"
#include "slm/engine/queued_engine.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/sampler.h"

namespace slm::engine {

namespace {

class DecodeEngine final : public QueuedEngine {
 public:
  DecodeEngine(std::vector<EngineModel> models, DecodeEngineOptions o, int64_t vocab, int64_t context)
      : QueuedEngine(std::move(o), vocab, context, models.size()), models_(std::move(models)) {
    start();
  }
  ~DecodeEngine() override { stop(); }

 private:
  void work() override {
    std::vector<std::shared_ptr<Job>> taken;
    while (take(1, false, taken)) {
      for (auto& job : taken) finish(job, execute(*job));
      taken.clear();
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
    go.sampling = sampler_options(r.sampling);
    go.banned = banned_;
    go.cuda_graph = options_.cuda_graph;
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
};

}  // namespace

std::unique_ptr<Engine> make_decode_engine(std::shared_ptr<model::HybridLM> model, DecodeEngineOptions options) {
  return make_decode_engine(EngineModel{std::move(model)}, std::move(options));
}

std::unique_ptr<Engine> make_decode_engine(EngineModel model, DecodeEngineOptions options) {
  if (!model.model) throw Error("engine: no model");
  if (batch_decode_blocker(*model.model).empty()) return make_batch_engine(std::move(model), std::move(options));
  std::vector<EngineModel> one{std::move(model)};
  const auto [vocab, context] = vocab_and_context(one, options);
  return std::make_unique<DecodeEngine>(std::move(one), std::move(options), vocab, context);
}

std::unique_ptr<Engine> make_mixture_engine(std::vector<EngineModel> models, DecodeEngineOptions options) {
  if (models.size() < 2) throw Error("engine: a mixture needs at least two models");
  const auto [vocab, context] = vocab_and_context(models, options);
  return std::make_unique<DecodeEngine>(std::move(models), std::move(options), vocab, context);
}

}  // namespace slm::engine
