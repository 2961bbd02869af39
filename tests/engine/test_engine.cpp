// The decode engine against the model's own prefill/decode loop, its stop ids, cancellation and refusals.
#include <gtest/gtest.h>

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
  eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 20, {}, {}}, s.callbacks());
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
  eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 12, {stop}, {}}, s.callbacks());
  const auto r = s.wait();
  EXPECT_EQ(r.finish, Finish::kStop);
  EXPECT_EQ(s.tokens, expected);
}

TEST(EngineDecode, SeededSamplingRepeats) {
  test::single_threaded();
  auto eng = make_decode_engine(test::serving_model(3), {});
  Sink a, b, c;
  eng->submit({kPrompt, {1.0, 0.9, 0, 42}, 16, {}, {}}, a.callbacks());
  eng->submit({kPrompt, {1.0, 0.9, 0, 42}, 16, {}, {}}, b.callbacks());
  eng->submit({kPrompt, {1.0, 0.9, 0, 43}, 16, {}, {}}, c.callbacks());
  a.wait(), b.wait(), c.wait();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_NE(a.tokens, c.tokens);
}

// One slot, so the second request really waits in the queue while the first runs (with eight it would be admitted on
// the worker's next loop, and whether cancel() still found it queued would depend on which thread ran first). The
// first request's first token holds the worker until the test has seen the queue and cancelled both requests.
TEST(EngineDecode, CancelStopsRunningAndQueuedRequests) {
  test::single_threaded();
  Sink running, queued;
  test::Signal first_token, release;
  DecodeEngineOptions o;
  o.slots = 1;
  auto eng = make_decode_engine(test::serving_model(4), o);
  test::SetOnExit let_go{release};
  const RequestId r = eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 4000, {}, {}}, running.callbacks([&](int64_t) {
    first_token.set();
    release.wait();  // every later token passes at once
  }));
  ASSERT_TRUE(first_token.wait()) << "the running request produced no token";
  const RequestId q = eng->submit({kPrompt, {0.0, 1.0, 0, 0}, 50, {}, {}}, queued.callbacks());
  const Stats held = eng->stats();
  EXPECT_EQ(held.running, 1);
  EXPECT_EQ(held.queued, 1);
  eng->cancel(q);  // a queued request ends inside cancel(), on this thread
  {
    std::lock_guard l(queued.mu);
    ASSERT_TRUE(queued.result.has_value()) << "cancel() of a queued request must end it at once";
    EXPECT_EQ(queued.result->finish, Finish::kCancelled);
    EXPECT_EQ(queued.result->prompt_tokens, static_cast<int64_t>(kPrompt.size()));
    EXPECT_EQ(queued.result->completion_tokens, 0);
    EXPECT_TRUE(queued.tokens.empty());
  }
  EXPECT_EQ(eng->stats().queued, 0);
  eng->cancel(r);  // while its first token's callback still runs: it ends after that token
  release.set();
  const auto r1 = running.wait();
  EXPECT_EQ(r1.finish, Finish::kCancelled);
  EXPECT_EQ(r1.completion_tokens, 1);
  EXPECT_EQ(running.tokens.size(), 1u);
  const Stats after = eng->stats();
  EXPECT_EQ(after.running, 0);
  EXPECT_EQ(after.queued, 0);
}

TEST(EngineDecode, RefusesBadRequestsAndAFullQueue) {
  test::single_threaded();
  Sink a, b;  // before the engine: its worker may touch them until it is joined
  test::Signal a_started, release;
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
  refused({{}, {}, 4, {}, {}}, "at least one token");
  refused({{2, 512}, {}, 4, {}, {}}, "outside the vocabulary");
  refused({{2, 3}, {}, 0, {}, {}}, "max_tokens must be at least 1");
  refused({{2, 3}, {}, 63, {}, {}}, "exceeds the model's context of 64");
  refused({{2, 3}, {-1.0, 1.0, 0, 0}, 4, {}, {}}, "temperature");
  // One running, one queued, the third is refused as QueueFull. a's first token holds the worker (it runs every
  // callback), so b stays queued however the threads are scheduled.
  test::SetOnExit let_go{release};
  eng->submit({{2, 3}, {0.0, 1.0, 0, 0}, 8, {}, {}}, a.callbacks([&](int64_t) {
    a_started.set();
    release.wait();
  }));
  ASSERT_TRUE(a_started.wait()) << "the first request produced no token";
  eng->submit({{2, 3}, {0.0, 1.0, 0, 0}, 8, {}, {}}, b.callbacks());
  EXPECT_EQ(eng->stats().queued, 1);
  EXPECT_THROW(eng->submit({{2, 3}, {0.0, 1.0, 0, 0}, 8, {}, {}}, {}), QueueFull);
  release.set();
  EXPECT_EQ(a.wait().finish, Finish::kLength);
  EXPECT_EQ(b.wait().finish, Finish::kLength);
  EXPECT_EQ(a.tokens.size(), 8u);
  EXPECT_EQ(b.tokens.size(), 8u);
}

}  // namespace
}  // namespace slm::engine
