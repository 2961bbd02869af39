// server/session.h: one generation as text. A fake engine hands the session tokens from the test (or from a thread
// the test starts), so each piece of text, each cancellation and each finish reason is checked against a hand-written
// expectation, with no model and no timing in the outcome. Token ids are the 512-id code tokenizer's byte-fallback
// ids (<0xNN> is id 26 + NN, tokenizer/README.md), so the bytes each id stands for are known without decoding.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"
#include "slm/server/session.h"

namespace slm::server {
namespace {

using engine::Finish;
using std::chrono::milliseconds;

constexpr engine::RequestId kId = 7;

int64_t byte_id(unsigned char b) {
  return 26 + b;
}

// An engine the test drives: submit() keeps the callbacks (and may run `during_submit` first, as an engine whose
// thread is fast enough to produce tokens before submit() returns), cancel() only records the id.
class FakeEngine : public engine::Engine {
 public:
  engine::RequestId submit(engine::Request r, engine::Callbacks cb) override {
    if (refuse) throw engine::QueueFull("the queue is full (0 requests waiting)");
    request = std::move(r);
    callbacks = std::move(cb);
    ++submits;
    if (during_submit) during_submit(*this);
    return kId;
  }
  void cancel(engine::RequestId id) override {
    std::lock_guard lock(mu);
    cancels.push_back(id);
  }
  engine::Stats stats() const override { return {}; }
  int64_t context_length() const override { return 64; }
  int64_t vocab_size() const override { return 512; }

  void token(int64_t id) { callbacks.on_token(id); }
  void text(const std::string& bytes) {
    for (unsigned char b : bytes) token(byte_id(b));
  }
  void done(Finish f, int64_t prompt, int64_t completion, const std::string& error = "") {
    callbacks.on_done({f, prompt, completion, error});
  }
  std::vector<engine::RequestId> cancelled() {
    std::lock_guard lock(mu);
    return cancels;
  }

  bool refuse = false;
  std::function<void(FakeEngine&)> during_submit;
  engine::Request request;
  engine::Callbacks callbacks;
  int submits = 0;

 private:
  std::mutex mu;
  std::vector<engine::RequestId> cancels;
};

engine::Request request() {
  engine::Request r;
  r.prompt = {2, 5, 130, 9, 6};
  r.max_tokens = 8;
  r.stop_ids = {9, 3};
  r.sampling.temperature = 0;
  return r;
}

// Whatever the session has now, without waiting.
std::string take(Session& s, bool& done) {
  return s.next(milliseconds(0), done);
}
std::string take(Session& s) {
  bool done = false;
  return take(s, done);
}

TEST(Session, TextComesOutAsWholeCharacters) {
  FakeEngine e;
  const auto t0 = std::chrono::steady_clock::now();
  {
    Session s(e, test::code512(), request(), {});
    EXPECT_EQ(s.result().first_token_s, -1);  // no token yet
    bool done = true;
    EXPECT_EQ(take(s, done), "");
    EXPECT_FALSE(done);
    e.token(byte_id('h'));
    const auto t1 = std::chrono::steady_clock::now();
    EXPECT_EQ(take(s), "h");
    e.token(byte_id(0xC3));  // the first byte of "é": held until the character is whole
    EXPECT_EQ(take(s), "");
    e.token(byte_id(0xA9));
    EXPECT_EQ(take(s), "\xC3\xA9");
    e.text("!");
    e.done(Finish::kLength, 5, 4);
    EXPECT_EQ(take(s, done), "!");
    EXPECT_TRUE(done);
    EXPECT_EQ(take(s, done), "");  // everything was returned; done stays
    EXPECT_TRUE(done);
    const auto r = s.result();
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.prompt_tokens, 5);
    EXPECT_EQ(r.completion_tokens, 4);
    // Measured from the session's start to the first token: within what this test measured around both.
    EXPECT_GE(r.first_token_s, 0);
    EXPECT_LE(r.first_token_s, std::chrono::duration<double>(t1 - t0).count());
  }
  EXPECT_TRUE(e.cancelled().empty());  // finished: the destructor cancels nothing
  EXPECT_EQ(e.submits, 1);
}

TEST(Session, TheRequestReachesTheEngineUnchanged) {
  FakeEngine e;
  Session s(e, test::code512(), request(), {"END"});
  EXPECT_EQ(e.request.prompt, std::vector<int64_t>({2, 5, 130, 9, 6}));
  EXPECT_EQ(e.request.max_tokens, 8);
  EXPECT_EQ(e.request.stop_ids, std::vector<int64_t>({9, 3}));
  EXPECT_EQ(e.request.sampling.temperature, 0);
  e.done(Finish::kLength, 5, 0);
}

TEST(Session, MultiBytePiecesAndInvalidUtf8) {
  FakeEngine e;
  Session s(e, test::code512(), request(), {});
  for (uint32_t id : test::code512().encode("int main() {")) e.token(id);
  EXPECT_EQ(take(s), "int main() {");
  // A lead byte followed by ASCII is ill-formed: U+FFFD for the lone byte, then the letter.
  e.token(byte_id(0xC3));
  e.token(byte_id('a'));
  EXPECT_EQ(take(s),
            "\xEF\xBF\xBD"
            "a");
  // A character cut off by the end of the generation is replaced as well.
  e.token(byte_id(0xE2));
  e.token(byte_id(0x82));
  EXPECT_EQ(take(s), "");
  e.done(Finish::kLength, 5, 17);
  bool done = false;
  EXPECT_EQ(take(s, done), "\xEF\xBF\xBD");
  EXPECT_TRUE(done);
}

TEST(Session, AStopStringCutsTheTextAndCancelsTheRest) {
  FakeEngine e;
  Session s(e, test::code512(), request(), {"END"});
  e.text("ab");
  EXPECT_EQ(take(s), "ab");
  e.text("EN");  // could still become the stop string: held back
  EXPECT_EQ(take(s), "");
  EXPECT_TRUE(e.cancelled().empty());
  e.text("D");
  EXPECT_EQ(e.cancelled(), std::vector<engine::RequestId>({kId}));
  e.text("xyz");  // tokens the engine produced before it saw the cancellation: dropped, no second cancel
  EXPECT_EQ(take(s), "");
  EXPECT_EQ(e.cancelled(), std::vector<engine::RequestId>({kId}));
  e.done(Finish::kCancelled, 5, 7);
  bool done = false;
  EXPECT_EQ(take(s, done), "");
  EXPECT_TRUE(done);
  const auto r = s.result();
  EXPECT_EQ(r.finish_reason, "stop");  // the stop string, not the cancellation it caused
  EXPECT_EQ(r.completion_tokens, 7);
}

TEST(Session, AHeldTailIsReleasedWhenItCannotBecomeTheStopString) {
  FakeEngine e;
  Session s(e, test::code512(), request(), {"END", "é"});
  e.text("E");
  EXPECT_EQ(take(s), "");
  e.text("x");
  EXPECT_EQ(take(s), "Ex");
  // At the end, what was held is text after all.
  e.text("EN");
  EXPECT_EQ(take(s), "");
  e.done(Finish::kLength, 5, 5);
  bool done = false;
  EXPECT_EQ(take(s, done), "EN");
  EXPECT_TRUE(done);
  EXPECT_EQ(s.result().finish_reason, "length");
  EXPECT_TRUE(e.cancelled().empty());
}

TEST(Session, StopStringsMatchWholeCharacters) {
  FakeEngine e;
  Session s(e, test::code512(), request(), {"é"});
  e.text("a\xC3");
  EXPECT_EQ(take(s), "a");
  EXPECT_TRUE(e.cancelled().empty());
  e.text("\xA9");
  EXPECT_EQ(e.cancelled(), std::vector<engine::RequestId>({kId}));
  e.done(Finish::kCancelled, 5, 3);
  bool done = false;
  EXPECT_EQ(take(s, done), "");
  EXPECT_TRUE(done);
  EXPECT_EQ(s.result().finish_reason, "stop");
}

TEST(Session, AStopStringSeenBeforeSubmitReturnsStillCancels) {
  FakeEngine e;
  e.during_submit = [](FakeEngine& f) { f.text("oEND"); };
  Session s(e, test::code512(), request(), {"END"});
  EXPECT_EQ(e.cancelled(), std::vector<engine::RequestId>({kId}));  // by the constructor, once the id was known
  EXPECT_EQ(take(s), "o");
  e.done(Finish::kCancelled, 5, 4);
  EXPECT_EQ(s.result().finish_reason, "stop");

  // Finished inside submit(): nothing left to cancel.
  FakeEngine quick;
  quick.during_submit = [](FakeEngine& f) {
    f.text("END");
    f.done(Finish::kLength, 5, 3);
  };
  Session q(quick, test::code512(), request(), {"END"});
  EXPECT_TRUE(quick.cancelled().empty());
  bool done = false;
  EXPECT_EQ(take(q, done), "");
  EXPECT_TRUE(done);
  EXPECT_EQ(q.result().finish_reason, "stop");
}

TEST(Session, FinishReasonsFromTheEngine) {
  struct Case {
    Finish finish;
    std::string error, reason;
  };
  for (const Case& c : {Case{Finish::kStop, "", "stop"}, Case{Finish::kLength, "", "length"},
                        Case{Finish::kCancelled, "", "cancelled"}, Case{Finish::kError, "model failed", "error"}}) {
    FakeEngine e;
    Session s(e, test::code512(), request(), {"END"});
    e.text("ok");
    e.done(c.finish, 5, 2, c.error);
    bool done = false;
    EXPECT_EQ(take(s, done), "ok");
    EXPECT_TRUE(done);
    EXPECT_EQ(s.result().finish_reason, c.reason);
    EXPECT_EQ(s.result().error, c.error);
  }
}

TEST(Session, CancelAndTheDestructorCancelOnlyWhatRuns) {
  FakeEngine e;
  {
    Session s(e, test::code512(), request(), {});
    e.text("a");
  }  // destroyed while generating: cancelled
  EXPECT_EQ(e.cancelled(), std::vector<engine::RequestId>({kId}));

  FakeEngine f;
  {
    Session s(f, test::code512(), request(), {});
    s.cancel();
    EXPECT_EQ(f.cancelled(), std::vector<engine::RequestId>({kId}));
    f.done(Finish::kCancelled, 5, 0);  // the engine confirms: the destructor has nothing left to cancel
    bool done = false;
    EXPECT_EQ(take(s, done), "");
    EXPECT_TRUE(done);
    EXPECT_EQ(s.result().finish_reason, "cancelled");
    EXPECT_EQ(s.result().first_token_s, -1);
  }
  EXPECT_EQ(f.cancelled(), std::vector<engine::RequestId>({kId}));
}

TEST(Session, NextWakesForTextAndTheEndFromTheEngineThread) {
  FakeEngine e;
  Session s(e, test::code512(), request(), {});
  // However the thread and next() interleave, next() returns the text (at once if it came first, woken if not);
  // the long timeout is only a deadline.
  std::thread producer([&] { e.text("x"); });
  bool done = false;
  std::string got = s.next(std::chrono::seconds(20), done);
  producer.join();
  EXPECT_EQ(got, "x");
  EXPECT_FALSE(done);
  std::thread finisher([&] { e.done(Finish::kLength, 5, 1); });
  got = s.next(std::chrono::seconds(20), done);
  finisher.join();
  EXPECT_EQ(got, "");
  EXPECT_TRUE(done);
}

TEST(Session, RefusedSubmitThrowsAndCancelsNothing) {
  FakeEngine e;
  e.refuse = true;
  EXPECT_THROW({ Session s(e, test::code512(), request(), {}); }, engine::QueueFull);
  EXPECT_TRUE(e.cancelled().empty());
}

TEST(Session, ASpecialistsEngineAndTokenizer) {
  Specialist sp;
  auto fake = std::make_unique<FakeEngine>();
  FakeEngine& e = *fake;
  sp.engine = std::move(fake);
  sp.tokenizer =
      std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model")));
  Session s(sp, request(), {});
  EXPECT_EQ(e.submits, 1);
  e.text("hi");
  e.done(Finish::kStop, 5, 2);
  bool done = false;
  EXPECT_EQ(take(s, done), "hi");
  EXPECT_TRUE(done);
  EXPECT_EQ(s.result().finish_reason, "stop");
}

}  // namespace
}  // namespace slm::server

namespace slm::server {
namespace {

TEST(Session, TheStopStringThatEndedItIsNamed) {
  FakeEngine e;
  Session s(e, test::code512(), request(), {"zz", "END", "NDx"});
  e.text("abENDx");  // one byte a token: "END" is complete (and ends the text) before "NDx" could be
  e.done(Finish::kCancelled, 5, 6);
  bool done = false;
  EXPECT_EQ(take(s, done), "ab");
  EXPECT_EQ(s.result().stop_word, "END");
  EXPECT_FALSE(s.result().text_limit);
}

// A TextLimit sees the text so far and where the newest token's text starts; the length it keeps never takes back
// text already handed out.
TEST(Session, ATextLimitEndsTheTextWhereItSays) {
  std::vector<std::pair<std::string, size_t>> seen;
  TextLimit cut_at_bang = [&](const std::string& text, size_t new_from, double) -> std::optional<size_t> {
    seen.emplace_back(text, new_from);
    const size_t at = text.find('!');
    return at == std::string::npos ? std::nullopt : std::optional<size_t>(at);
  };
  FakeEngine e;
  Session s(e, test::code512(), request(), {}, cut_at_bang);
  e.text("ab");
  e.text("!c");
  EXPECT_EQ(e.cancelled(), std::vector<engine::RequestId>({kId}));
  e.text("d");  // after the cut: dropped
  e.done(Finish::kCancelled, 5, 5);
  bool done = false;
  EXPECT_EQ(take(s, done), "ab");
  EXPECT_TRUE(done);
  EXPECT_EQ(s.result().finish_reason, "stop");
  EXPECT_TRUE(s.result().text_limit);
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, size_t>>{{"a", 0}, {"ab", 1}, {"ab!", 2}}));

  // Text taken before the limit fires stays taken: a cut inside it is raised to its end.
  TextLimit keep_one = [](const std::string& text, size_t, double) -> std::optional<size_t> {
    return text.size() >= 3 ? std::optional<size_t>(1) : std::nullopt;
  };
  FakeEngine f;
  Session t(f, test::code512(), request(), {}, keep_one);
  f.text("ab");
  EXPECT_EQ(take(t), "ab");
  f.text("c");
  f.done(Finish::kCancelled, 5, 3);
  EXPECT_EQ(take(t, done), "");
  EXPECT_TRUE(done);
  EXPECT_TRUE(t.result().text_limit);
}

}  // namespace
}  // namespace slm::server
