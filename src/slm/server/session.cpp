#include "slm/server/session.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "slm/data/detokenizer.h"
#include "slm/text/stop_text.h"

namespace slm::server {

struct Session::State {
  State(const data::Tokenizer& t, std::vector<std::string> stops, TextLimit l)
      : detok(t), stop(stops), stops(std::move(stops)), limit(std::move(l)) {}
  std::mutex mu;
  std::condition_variable cv;
  data::Detokenizer detok;
  text::StopText stop;
  std::vector<std::string> stops;
  TextLimit limit;
  std::string raw;       // everything decoded, before the stop strings are cut (to name the one that matched)
  std::string shown;     // everything produced for the client (taken or pending)
  std::string pending;   // produced, not yet taken by next()
  bool limited = false;  // the TextLimit ended it
  bool done = false;
  SessionResult result;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  bool ended() const { return stop.stopped() || limited; }
  // Takes decoded text through the stop strings and the limit. Called with mu held.
  void produce(const std::string& decoded) {
    if (!stops.empty()) raw += decoded;
    const std::string out = stop.push(decoded);
    pending += out;
    shown += out;
    if (stop.stopped()) {
      // The text shown is raw's prefix up to the stop string; of those that start there, the first listed.
      for (const auto& s : stops)
        if (!s.empty() && raw.compare(shown.size(), s.size(), s) == 0) {
          result.stop_word = s;
          break;
        }
      return;
    }
    if (!limit) return;
    const double since_first =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - result.first_token_s;
    const auto keep = limit(shown, shown.size() - out.size(), since_first);
    if (!keep) return;
    const size_t taken = shown.size() - pending.size();
    const size_t n = std::min(shown.size(), std::max(*keep, taken));
    pending.resize(n - taken);
    shown.resize(n);
    limited = true;
  }
};

Session::Session(engine::Engine& engine, const data::Tokenizer& tokenizer, engine::Request request,
                 std::vector<std::string> stop_strings, TextLimit limit)
    : state_(std::make_shared<State>(tokenizer, std::move(stop_strings), std::move(limit))), engine_(engine) {
  auto st = state_;
  engine::Engine* eng = &engine;
  auto id = std::make_shared<std::atomic<engine::RequestId>>(0);
  engine::Callbacks cb;
  // The engine may call on_done from cancel() (a request that had not started), so cancel() is never called
  // with st->mu held.
  cb.on_token = [st, eng, id](int64_t token) {
    bool stop_now = false;
    {
      std::lock_guard lock(st->mu);
      if (st->result.first_token_s < 0)
        st->result.first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - st->start).count();
      if (st->ended()) return;
      st->produce(data::replace_invalid_utf8(st->detok.push(static_cast<uint32_t>(token))));
      stop_now = st->ended();
      st->cv.notify_all();
    }
    // The id is known once submit() returns; a stop string seen before that is caught right after submit().
    if (stop_now && id->load()) eng->cancel(id->load());
  };
  cb.on_done = [st](const engine::Result& r) {
    std::lock_guard lock(st->mu);
    if (!st->ended()) st->produce(data::replace_invalid_utf8(st->detok.flush()));
    if (!st->ended()) {
      const std::string tail = st->stop.flush();
      st->pending += tail;
      st->shown += tail;
    }
    st->result.prompt_tokens = r.prompt_tokens;
    st->result.completion_tokens = r.completion_tokens;
    st->result.cached_tokens = r.cached_tokens;
    st->result.text_limit = st->limited;
    st->result.finish_reason = st->ended() ? "stop" : engine::finish_name(r.finish);
    st->result.error = r.error;
    st->done = true;
    st->cv.notify_all();
  };
  id_ = engine_.submit(std::move(request), std::move(cb));
  id->store(id_);
  bool stopped;
  {
    std::lock_guard lock(state_->mu);
    stopped = state_->ended() && !state_->done;
  }
  if (stopped) engine_.cancel(id_);
}

Session::~Session() {
  bool done;
  {
    std::lock_guard lock(state_->mu);
    done = state_->done;
  }
  if (!done) engine_.cancel(id_);  // a no-op when it finished in between
}

void Session::cancel() {
  engine_.cancel(id_);
}

std::string Session::next(std::chrono::milliseconds timeout, bool& done) {
  std::unique_lock lock(state_->mu);
  state_->cv.wait_for(lock, timeout, [&] { return state_->done || !state_->pending.empty(); });
  std::string out;
  out.swap(state_->pending);
  done = state_->done;
  return out;
}

SessionResult Session::result() const {
  std::lock_guard lock(state_->mu);
  return state_->result;
}

}  // namespace slm::server
