// The decode engine against the model's own prefill/decode loop, its stop ids, cancellation and refusals.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/engine_test_util.h"
#include "slm/engine/decode_engine.h"

namespace slm::engine {
namespace {

using Sink = test::TokenSink;

const std::vector<int64_t> kPrompt = {2, 300, 301, 45, 7, 400};

TEST(EngineDecode, GreedyTokensEqualTheModelsOwnLoop) {
  test::single_threaded();
  auto m = test::serving_model(1);
  const std::vector<int64_t> banned = {0, 1, 2, 4, 5};
  const auto expected = test::greedy_reference(*m, kPrompt, 20, banned, {});
  ASSERT_EQ(expected.size(), 20u);
  auto eng = make_decode_engine(m, {banned, 8, 0});
  Sink s;
  eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 20, {}}, s.callbacks());
  const auto r = s.wait();
  EXPECT_EQ(r.finish, Finish::kLength);
  EXPECT_EQ(s.tokens, expected);
  EXPECT_EQ(r.prompt_tokens, 6);
  EXPECT_EQ(r.completion_tokens, 20);
}

TEST(EngineDecode, StopIdEndsWithoutBeingDelivered) {
  test::single_threaded();
  auto m = test::serving_model(2);
  const auto free_run = test::greedy_reference(*m, kPrompt, 12, {}, {});
  // Stop at the first occurrence of the 6th token: everything before it is delivered.
  const int64_t stop = free_run[5];
  const auto expected = test::greedy_reference(*m, kPrompt, 12, {}, {stop});
  ASSERT_LT(expected.size(), 12u);
  auto eng = make_decode_engine(m, {});
  Sink s;
  eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 12, {stop}}, s.callbacks());
  const auto r = s.wait();
  EXPECT_EQ(r.finish, Finish::kStop);
  EXPECT_EQ(s.tokens, expected);
}

TEST(EngineDecode, SeededSamplingRepeats) {
  test::single_threaded();
  auto eng = make_decode_engine(test::serving_model(3), {});
  Sink a, b, c;
  eng->submit({kPrompt, {1.0, 0.9, 0, 42}, 16, {}}, a.callbacks());
  eng->submit({kPrompt, {1.0, 0.9, 0, 42}, 16, {}}, b.callbacks());
  eng->submit({kPrompt, {1.0, 0.9, 0, 43}, 16, {}}, c.callbacks());
  a.wait(), b.wait(), c.wait();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, c.tokens);
}

TEST(EngineDecode, CancelStopsRunningAndQueuedRequests) {
  test::single_threaded();
  auto eng = make_decode_engine(test::serving_model(4), {});
  Sink running, queued;
  std::atomic<RequestId> rid{0};
  std::atomic<bool> cancelled{false};
  Engine* e = eng.get();
  rid = eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 4000, {}}, running.callbacks([&](int64_t) {
    // From inside the first token's callback, which can come before submit() has returned the id to this thread.
    if (cancelled.exchange(true)) return;
    RequestId id;
    while ((id = rid.load()) == 0) std::this_thread::yield();
    e->cancel(id);
  }));
  const RequestId q = eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 50, {}}, queued.callbacks());
  eng->cancel(q);
  const auto r1 = running.wait();
  const auto r2 = queued.wait();
  EXPECT_EQ(r1.finish, Finish::kCancelled);
  EXPECT_LT(r1.completion_tokens, 4);  // the token in flight at most
  EXPECT_EQ(r2.finish, Finish::kCancelled);
  EXPECT_TRUE(queued.tokens.empty());
  EXPECT_EQ(eng->stats().queued, 0);
}

TEST(EngineDecode, RefusesBadRequestsAndAFullQueue) {
  test::single_threaded();
  auto eng = make_decode_engine(test::serving_model(5, 64), {{}, 1, 0});
  EXPECT_EQ(eng->context_length(), 64);
  auto refused = [&](Request r, const std::string& fragment) {
    try {
      eng->submit(std::move(r), {});
      ADD_FAILURE() << "accepted; expected: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  refused({{}, {}, 4, {}}, "at least one token");
  refused({{2, 512}, {}, 4, {}}, "outside the vocabulary");
  refused({{2, 3}, {}, 0, {}}, "max_tokens must be at least 1");
  refused({{2, 3}, {}, 63, {}}, "exceeds the model's context of 64");
  refused({{2, 3}, {-1.0, 1.0, 0, 0}, 4, {}}, "temperature");
  // One running, one queued, the third is refused as QueueFull.
  Sink a, b;
  std::mutex gate;
  gate.lock();
  std::atomic<bool> first{true};
  eng->submit({{2, 3}, {0.0, 1.0, 0, 0}, 8, {}}, a.callbacks([&](int64_t) {
    if (first.exchange(false)) std::lock_guard wait_for_test(gate);  // holds the worker until the test is done
  }));
  while (eng->stats().running == 0) std::this_thread::yield();
  eng->submit({{2, 3}, {0.0, 1.0, 0, 0}, 8, {}}, b.callbacks());
  EXPECT_THROW(eng->submit({{2, 3}, {0.0, 1.0, 0, 0}, 8, {}}, {}), QueueFull);
  gate.unlock();
  EXPECT_EQ(a.wait().finish, Finish::kLength);
  EXPECT_EQ(b.wait().finish, Finish::kLength);
}

}  // namespace
}  // namespace slm::engine
