#pragma once
// A micro model with the code tokenizer's 512 ids for the engine and server tests, and an independent greedy
// reference: the model's own prefill + decode steps with argmax, written out here.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "model/model_test_util.h"
#include "slm/data/tokenizer.h"
#include "slm/engine/engine.h"
#include "slm/model/hybrid_lm.h"

namespace slm::test {

inline std::shared_ptr<model::HybridLM> serving_model(uint64_t seed, int64_t seq_len = 4096) {
  auto j = nlohmann::json::parse(R"({
    "name": "serve-micro", "vocab_size": 512, "d_model": 32, "depth": 2, "pattern": "AE", "seq_len": 128,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 16},
    "moe": {"routed_experts": 4, "experts_per_token": 2, "expert_hidden": 32}
  })");
  j["seq_len"] = seq_len;
  auto m = std::make_shared<model::HybridLM>(parse_recipe_text(j.dump(), "serve-micro.json"));
  randomize(*m, seed);
  m->eval();
  return m;
}

inline const data::Tokenizer& code512() {
  static const data::Tokenizer t = data::Tokenizer::load(source_path("tokenizer/slm-code-512.model"));
  return t;
}

// Greedy tokens after `prompt`: argmax over the ids not in `banned`, stopping before any id in `stop`. With
// penalties (sampler.h's definitions, by a loop over the ids seen): repetition over the prompt and the output,
// presence and frequency over the output.
struct Penalties {
  float repetition = 1, presence = 0, frequency = 0;
};
inline std::vector<int64_t> greedy_reference(model::HybridLM& m, const std::vector<int64_t>& prompt, int64_t max_tokens,
                                             const std::vector<int64_t>& banned, const std::vector<int64_t>& stop,
                                             Penalties pen = {}) {
  torch::NoGradGuard ng;
  auto state = m.new_state(1, static_cast<int64_t>(prompt.size()) + max_tokens);
  const auto device = m.embed->weight.device();
  auto logits =
      m.prefill(torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device), state).select(1, prompt.size() - 1);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < max_tokens; ++i) {
    auto l = logits.to(torch::kCPU, torch::kFloat).clone();
    std::vector<int64_t> seen = prompt;
    seen.insert(seen.end(), out.begin(), out.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int64_t id : seen) {
      float x = l[0][id].item<float>();
      const auto n = static_cast<float>(std::count(out.begin(), out.end(), id));
      x = x > 0 ? x / pen.repetition : x * pen.repetition;
      x = x - n * pen.frequency;
      x = x - (n > 0 ? pen.presence : 0.0f);
      l[0][id] = x;
    }
    for (int64_t b : banned) l[0][b] = -std::numeric_limits<float>::infinity();
    const int64_t id = l.argmax(-1).item<int64_t>();
    if (std::find(stop.begin(), stop.end(), id) != stop.end()) break;
    out.push_back(id);
    logits = m.decode(torch::tensor({id}, torch::kLong).to(device), state);
  }
  return out;
}

// A one-shot event between the test and an engine's worker thread: set() once; wait() blocks until it is set or the
// deadline passes and says which. Tests hold the worker inside a callback with it (the worker runs every callback,
// so while it waits there nothing else of that engine moves) instead of sleeping or spinning on a race.
struct Signal {
  std::mutex mu;
  std::condition_variable cv;
  bool is_set = false;
  void set() {
    {
      std::lock_guard l(mu);
      is_set = true;
    }
    cv.notify_all();
  }
  bool wait(std::chrono::seconds deadline = std::chrono::seconds(60)) {
    std::unique_lock l(mu);
    return cv.wait_for(l, deadline, [&] { return is_set; });
  }
};

// Sets the signal when the scope ends, so that a failed ASSERT never leaves a worker held until its deadline.
struct SetOnExit {
  Signal& signal;
  ~SetOnExit() { signal.set(); }
};

// Collects one engine request's tokens and waits for its end. also (optional) sees each token after it is stored.
struct TokenSink {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> tokens;
  std::optional<engine::Result> result;
  engine::Callbacks callbacks(std::function<void(int64_t)> also = {}) {
    return {[this, also](int64_t t) {
              {
                std::lock_guard l(mu);
                tokens.push_back(t);
              }
              if (also) also(t);
            },
            [this](const engine::Result& r) {
              std::lock_guard l(mu);
              result = r;
              cv.notify_all();
            }};
  }
  engine::Result wait() {
    std::unique_lock l(mu);
    cv.wait_for(l, std::chrono::seconds(120), [&] { return result.has_value(); });
    EXPECT_TRUE(result.has_value());
    return result.value_or(engine::Result{engine::Finish::kError, 0, 0, "no result within 120 s"});
  }
};

}  // namespace slm::test
