// engine/queued_engine.h: the request checks, bounded FIFO queue, cancellation, stats and stop that both decode
// engines share. A scripted subclass stands in for the model loop: its worker takes jobs as the real ones do, then
// holds each round until the test grants it, so "queued" and "running" are states the test sets, not races it wins.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_test_util.h"
#include "slm/engine/queued_engine.h"

namespace slm::engine {
namespace {

constexpr auto kDeadline = std::chrono::seconds(20);

// What the scripted worker tells the test; owned by the test so that it outlives the engine.
struct Script {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<RequestId>> rounds;       // the ids each take() moved out, in order
  int grants = 0;                                   // rounds the test lets the worker finish
  bool quit = false;                                // the engine is being destroyed
  std::vector<RequestId> saw_cancelled;             // jobs the worker found marked cancelled when it ran them
  std::vector<std::pair<RequestId, bool>> at_stop;  // jobs left at destruction, with their cancelled mark

  // Waits until pred holds (under the lock), at most kDeadline.
  bool wait(const std::function<bool()>& pred) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kDeadline, pred);
  }
  void grant() {
    {
      std::lock_guard lock(mu);
      ++grants;
    }
    cv.notify_all();
  }
};

class ScriptedEngine : public QueuedEngine {
 public:
  ScriptedEngine(Script& script, size_t batch, DecodeEngineOptions o, int64_t vocab, int64_t context, size_t models = 1)
      : QueuedEngine(std::move(o), vocab, context, models), script_(script), batch_(batch) {
    start();
  }
  ~ScriptedEngine() override {
    {
      std::lock_guard lock(script_.mu);
      script_.quit = true;
    }
    script_.cv.notify_all();
    stop();
    // The worker has returned, leaving its held round (if any) in held_; stop() should have marked those jobs and
    // every queued one cancelled. take(busy) collects the queued ones without waiting.
    std::vector<std::shared_ptr<Job>> left = held_;
    take(std::numeric_limits<size_t>::max(), true, left);
    for (const auto& job : left) {
      {
        std::lock_guard lock(script_.mu);
        script_.at_stop.emplace_back(job->id, job->cancelled.load());
      }
      finish(job, {Finish::kCancelled, static_cast<int64_t>(job->request.prompt.size()), 0, ""});
    }
  }
  const torch::Tensor& banned() const { return banned_; }

 private:
  // Each round: take up to batch_ jobs (waiting for one), report them, wait for a grant, then run each: a job
  // marked cancelled ends cancelled; otherwise it emits prompt[0], prompt[0] + 1, ... (max_tokens ids, at most 64:
  // a request that should have been refused must not run forever) and ends with length.
  void work() override {
    for (;;) {
      std::vector<std::shared_ptr<Job>> taken;
      if (!take(batch_, false, taken)) return;
      for (const auto& job : taken) reused_prompt_tokens_ += static_cast<int64_t>(job->request.prompt.size());
      if (taken.size() > 1) batched_prompts_ += static_cast<int64_t>(taken.size());
      {
        std::unique_lock lock(script_.mu);
        std::vector<RequestId> ids;
        for (const auto& job : taken) ids.push_back(job->id);
        script_.rounds.push_back(ids);
        script_.cv.notify_all();
        script_.cv.wait(lock, [&] { return script_.grants > 0 || script_.quit; });
        if (script_.grants == 0) {
          held_ = taken;
          return;
        }
        --script_.grants;
      }
      for (const auto& job : taken) {
        const auto n = static_cast<int64_t>(job->request.prompt.size());
        if (job->cancelled) {
          {
            std::lock_guard lock(script_.mu);
            script_.saw_cancelled.push_back(job->id);
          }
          finish(job, {Finish::kCancelled, n, 0, ""});
          continue;
        }
        const int64_t m = std::min<int64_t>(job->request.max_tokens, 64);
        for (int64_t i = 0; i < m; ++i) job->callbacks.on_token(job->request.prompt[0] + i);
        finish(job, {Finish::kLength, n, m, ""});
      }
    }
  }

  Script& script_;
  const size_t batch_;
  std::vector<std::shared_ptr<Job>> held_;
};

// One request's tokens and every on_done call it got (exactly one is the contract).
struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> tokens;
  std::vector<Result> done;
  std::function<void()> inside_done;  // runs in on_done (to see what the engine looks like from there)
  Callbacks callbacks() {
    return {[this](int64_t t) {
              std::lock_guard lock(mu);
              tokens.push_back(t);
            },
            [this](const Result& r) {
              if (inside_done) inside_done();
              {
                std::lock_guard lock(mu);
                done.push_back(r);
              }
              cv.notify_all();
            }};
  }
  bool wait_done() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, kDeadline, [&] { return !done.empty(); });
  }
  size_t done_count() {
    std::lock_guard lock(mu);
    return done.size();
  }
};

Request request(std::vector<int64_t> prompt, int64_t max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

void expect_result(const Result& r, Finish finish, int64_t prompt, int64_t completion) {
  EXPECT_EQ(r.finish, finish);
  EXPECT_EQ(r.prompt_tokens, prompt);
  EXPECT_EQ(r.completion_tokens, completion);
  EXPECT_EQ(r.error, "");
}

void expect_stats(const Stats& s, int64_t queued, int64_t running, int64_t reused, int64_t batched) {
  EXPECT_EQ(s.queued, queued);
  EXPECT_EQ(s.running, running);
  EXPECT_EQ(s.reused_prompt_tokens, reused);
  EXPECT_EQ(s.batched_prompts, batched);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(QueuedEngine, SamplerOptionsKeepEveryField) {
  Sampling s;
  s.temperature = 0.7;
  s.top_p = 0.8;
  s.top_k = 5;
  s.seed = 9;
  s.repetition_penalty = 1.1;
  s.presence_penalty = 0.2;
  s.frequency_penalty = -0.3;
  const auto o = sampler_options(s);
  EXPECT_EQ(o.temperature, 0.7);
  EXPECT_EQ(o.top_p, 0.8);
  EXPECT_EQ(o.top_k, 5);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_EQ(o.repetition_penalty, 1.1);
  EXPECT_EQ(o.presence_penalty, 0.2);
  EXPECT_EQ(o.frequency_penalty, -0.3);
}

TEST(QueuedEngine, VocabularyAndContextOfTheModels) {
  test::single_threaded();
  const EngineModel long_model{test::serving_model(1, 100)}, short_model{test::serving_model(2, 60)};
  DecodeEngineOptions o;
  EXPECT_EQ(vocab_and_context({long_model}, o), std::make_pair(int64_t{512}, int64_t{100}));
  // A mixture accepts what its shortest model does.
  EXPECT_EQ(vocab_and_context({long_model, short_model}, o), std::make_pair(int64_t{512}, int64_t{60}));
  EXPECT_EQ(vocab_and_context({short_model, long_model}, o), std::make_pair(int64_t{512}, int64_t{60}));
  o.context_length = 500;  // given explicitly, it is taken as is
  EXPECT_EQ(vocab_and_context({long_model, short_model}, o), std::make_pair(int64_t{512}, int64_t{500}));

  auto j = nlohmann::json::parse(R"({
    "name": "micro-256", "vocab_size": 256, "d_model": 16, "depth": 1, "pattern": "A", "seq_len": 32,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 8}})");
  const EngineModel other{std::make_shared<model::HybridLM>(parse_recipe_text(j.dump(), "micro-256.json"))};
  EXPECT_EQ(error_of([&] {
              vocab_and_context({long_model, other}, {});
            }),
            "engine: a mixture needs one vocabulary; micro-256 has 256 ids, serve-micro 512");
  EXPECT_EQ(error_of([&] { vocab_and_context({EngineModel{nullptr}}, {}); }), "engine: no model");
  EXPECT_EQ(error_of([&] { vocab_and_context({EngineModel{long_model.model, nullptr}}, {}); }), "engine: no model");
}

TEST(QueuedEngine, BannedIdsBecomeAMaskAndMustBeInTheVocabulary) {
  Script script;
  DecodeEngineOptions o;
  o.banned_ids = {0, 5, 31};
  {
    const ScriptedEngine e(script, 1, o, 32, 16);
    const auto& mask = e.banned();
    ASSERT_EQ(mask.dim(), 1);
    ASSERT_EQ(mask.size(0), 32);
    ASSERT_EQ(mask.scalar_type(), torch::kBool);
    for (int64_t id = 0; id < 32; ++id) EXPECT_EQ(mask[id].item<bool>(), id == 0 || id == 5 || id == 31) << id;
    EXPECT_EQ(e.vocab_size(), 32);
    EXPECT_EQ(e.context_length(), 16);
  }
  for (int64_t bad : {-1, 32}) {
    o.banned_ids = {3, bad};
    EXPECT_EQ(error_of([&] { ScriptedEngine(script, 1, o, 32, 16); }),
              "engine: banned id " + std::to_string(bad) + " is outside the vocabulary");
  }
}

TEST(QueuedEngine, SubmitRefusesBadRequestsWithoutQueueingThem) {
  Script script;
  ScriptedEngine e(script, 1, {}, 512, 10);
  Sink sink;
  EXPECT_EQ(error_of([&] { e.submit(request({}, 3), sink.callbacks()); }), "the prompt must hold at least one token");
  for (int64_t bad : {0, -5})
    EXPECT_EQ(error_of([&] { e.submit(request({1}, bad), sink.callbacks()); }), "max_tokens must be at least 1");
  EXPECT_EQ(error_of([&] {
              e.submit(request({1, 2, 3, 4}, 7), sink.callbacks());
            }),
            "the prompt (4 tokens) plus max_tokens (7) exceeds the model's context of 10 tokens");
  // So large that prompt + max_tokens does not fit in 64 bits: still longer than the context.
  EXPECT_EQ(error_of([&] {
              e.submit(request({1, 2}, std::numeric_limits<int64_t>::max()), sink.callbacks());
            }),
            "the prompt (2 tokens) plus max_tokens (9223372036854775807) exceeds the model's context of 10 tokens");
  for (int64_t bad : {-1, 512})
    EXPECT_EQ(error_of([&] {
                e.submit(request({1, bad, 2}, 1), sink.callbacks());
              }),
              "prompt token " + std::to_string(bad) + " is outside the vocabulary");
  auto bad_sampling = request({1}, 1);
  bad_sampling.sampling.temperature = -0.5;
  EXPECT_EQ(error_of([&] { e.submit(bad_sampling, sink.callbacks()); }), "sampler: temperature must be >= 0");
  bad_sampling.sampling.temperature = 1;
  bad_sampling.sampling.top_p = 0;
  EXPECT_EQ(error_of([&] { e.submit(bad_sampling, sink.callbacks()); }), "sampler: top_p must be in (0, 1]");
  // A single model ignores mixture weights, whatever they are.
  auto weighted = request({1}, 1);
  weighted.mixture_weights = {0, -1, 0};
  expect_stats(e.stats(), 0, 0, 0, 0);
  EXPECT_EQ(sink.done_count(), 0u);

  // Nothing refused took an id; prompt + max_tokens equal to the context fits.
  EXPECT_EQ(e.submit(request({1, 2, 3, 4}, 6), sink.callbacks()), 1u);
  Sink second;
  EXPECT_EQ(e.submit(weighted, second.callbacks()), 2u);
  ASSERT_TRUE(script.wait([&] { return !script.rounds.empty(); }));
  script.grant();
  script.grant();
  ASSERT_TRUE(sink.wait_done());
  ASSERT_TRUE(second.wait_done());
  expect_result(sink.done.at(0), Finish::kLength, 4, 6);
  EXPECT_EQ(sink.tokens, std::vector<int64_t>({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(second.tokens, std::vector<int64_t>({1}));
}

TEST(QueuedEngine, MixtureWeightsArePositiveAndOnePerModel) {
  Script script;
  ScriptedEngine e(script, 1, {}, 512, 10, 2);
  Sink sink;
  for (const std::vector<double>& w : {std::vector<double>{1.0}, std::vector<double>{1, 1, 1}}) {
    auto r = request({1}, 1);
    r.mixture_weights = w;
    EXPECT_EQ(error_of([&] { e.submit(r, sink.callbacks()); }),
              "mixture_weights has " + std::to_string(w.size()) + " entries for 2 models");
  }
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto r = request({1}, 1);
    r.mixture_weights = {0.5, bad};
    EXPECT_EQ(error_of([&] { e.submit(r, sink.callbacks()); }), "mixture weights must be positive") << bad;
  }
  expect_stats(e.stats(), 0, 0, 0, 0);
  auto equal = request({1}, 1);  // empty: equal weights
  auto given = request({2}, 1);
  given.mixture_weights = {0.7, 0.3};
  Sink a, b;
  EXPECT_EQ(e.submit(equal, a.callbacks()), 1u);
  EXPECT_EQ(e.submit(given, b.callbacks()), 2u);
  script.grant();
  script.grant();
  ASSERT_TRUE(a.wait_done());
  ASSERT_TRUE(b.wait_done());
}

TEST(QueuedEngine, QueueIsFifoBoundedAndCounted) {
  Script script;
  DecodeEngineOptions o;
  o.max_queue = 2;
  ScriptedEngine e(script, 2, o, 512, 64);
  Sink a, b, c, d, f;
  EXPECT_EQ(e.submit(request({10, 11, 12}, 2), a.callbacks()), 1u);
  ASSERT_TRUE(script.wait([&] { return script.rounds.size() == 1; }));  // the worker holds A
  EXPECT_EQ(e.submit(request({20}, 1), b.callbacks()), 2u);
  EXPECT_EQ(e.submit(request({30, 31}, 3), c.callbacks()), 3u);
  expect_stats(e.stats(), 2, 1, 3, 0);
  try {
    e.submit(request({40}, 1), d.callbacks());
    ADD_FAILURE() << "a third waiting request was accepted";
  } catch (const QueueFull& full) {
    EXPECT_EQ(std::string(full.what()), "the queue is full (2 requests waiting)");
  }

  script.grant();  // A ends; the next take moves B and C together, oldest first
  ASSERT_TRUE(a.wait_done());
  ASSERT_TRUE(script.wait([&] { return script.rounds.size() == 2; }));
  expect_stats(e.stats(), 0, 2, 6, 2);
  EXPECT_EQ(e.submit(request({50}, 1), f.callbacks()), 4u);  // the refused request took no id
  script.grant();
  script.grant();
  ASSERT_TRUE(b.wait_done());
  ASSERT_TRUE(c.wait_done());
  ASSERT_TRUE(f.wait_done());
  EXPECT_EQ(script.rounds, (std::vector<std::vector<RequestId>>{{1}, {2, 3}, {4}}));
  expect_stats(e.stats(), 0, 0, 7, 2);

  EXPECT_EQ(a.tokens, std::vector<int64_t>({10, 11}));
  EXPECT_EQ(b.tokens, std::vector<int64_t>({20}));
  EXPECT_EQ(c.tokens, std::vector<int64_t>({30, 31, 32}));
  for (Sink* s : {&a, &b, &c, &f}) EXPECT_EQ(s->done_count(), 1u);
  expect_result(a.done[0], Finish::kLength, 3, 2);
  expect_result(c.done[0], Finish::kLength, 2, 3);
  EXPECT_EQ(d.done_count(), 0u);
}

TEST(QueuedEngine, CancellingAQueuedRequestEndsItAtOnce) {
  Script script;
  ScriptedEngine e(script, 1, {}, 512, 64);
  Sink a, b, c;
  e.submit(request({1}, 1), a.callbacks());
  ASSERT_TRUE(script.wait([&] { return script.rounds.size() == 1; }));
  const RequestId idb = e.submit(request({2, 3}, 1), b.callbacks());
  e.submit(request({4}, 1), c.callbacks());
  // on_done runs inside cancel(), outside the engine's lock (stats() would deadlock otherwise), after the
  // request left the queue.
  Stats seen_inside;
  b.inside_done = [&] { seen_inside = e.stats(); };
  e.cancel(idb);
  ASSERT_EQ(b.done_count(), 1u);  // already, before cancel() returned
  expect_result(b.done[0], Finish::kCancelled, 2, 0);
  EXPECT_TRUE(b.tokens.empty());
  expect_stats(seen_inside, 1, 1, 1, 0);
  expect_stats(e.stats(), 1, 1, 1, 0);
  e.cancel(idb);  // again: unknown now, ignored
  EXPECT_EQ(b.done_count(), 1u);

  script.grant();
  script.grant();
  ASSERT_TRUE(c.wait_done());
  EXPECT_EQ(script.rounds, (std::vector<std::vector<RequestId>>{{1}, {3}}));  // B never started
  EXPECT_EQ(b.done_count(), 1u);
}

TEST(QueuedEngine, CancellingARunningRequestMarksItForTheWorker) {
  Script script;
  ScriptedEngine e(script, 1, {}, 512, 64);
  Sink a, b;
  const RequestId ida = e.submit(request({1, 2}, 3), a.callbacks());
  ASSERT_TRUE(script.wait([&] { return script.rounds.size() == 1; }));
  e.cancel(ida);
  EXPECT_EQ(a.done_count(), 0u);  // a running request ends through its worker, not in cancel()
  expect_stats(e.stats(), 0, 1, 2, 0);
  script.grant();
  ASSERT_TRUE(a.wait_done());
  EXPECT_EQ(script.saw_cancelled, std::vector<RequestId>({ida}));
  expect_result(a.done[0], Finish::kCancelled, 2, 0);
  expect_stats(e.stats(), 0, 0, 2, 0);
  // Finished and unknown ids are ignored.
  e.cancel(ida);
  e.cancel(12345);
  EXPECT_EQ(a.done_count(), 1u);
  // The next request is not affected by the earlier cancellation.
  e.submit(request({7}, 2), b.callbacks());
  script.grant();
  ASSERT_TRUE(b.wait_done());
  expect_result(b.done[0], Finish::kLength, 1, 2);
  EXPECT_EQ(b.tokens, std::vector<int64_t>({7, 8}));
}

TEST(QueuedEngine, DestroyingTheEngineCancelsRunningAndQueuedRequests) {
  Script script;
  Sink a, b, c;
  {
    ScriptedEngine e(script, 1, {}, 512, 64);
    e.submit(request({1}, 1), a.callbacks());
    ASSERT_TRUE(script.wait([&] { return script.rounds.size() == 1; }));
    e.submit(request({2}, 1), b.callbacks());
    e.submit(request({3}, 1), c.callbacks());
  }
  // stop() marked the running request and both waiting ones cancelled before the worker was joined.
  EXPECT_EQ(script.at_stop, (std::vector<std::pair<RequestId, bool>>{{1, true}, {2, true}, {3, true}}));
  for (Sink* s : {&a, &b, &c}) EXPECT_EQ(s->done_count(), 1u);
  // An idle engine stops too: take() wakes and the worker returns (the test would hang otherwise).
  Script idle;
  { ScriptedEngine e(idle, 1, {}, 512, 64); }
  EXPECT_TRUE(idle.rounds.empty());
  EXPECT_TRUE(idle.at_stop.empty());
}

}  // namespace
}  // namespace slm::engine
