#pragma once
// One generation in flight, as text: submits token ids to a specialist's engine and turns the tokens it streams
// back into text pieces (whole UTF-8 characters, cut at the first stop string, which also cancels the rest of the
// generation). The HTTP thread pulls the pieces with next(); the engine's callbacks only append under a lock.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slm/engine/engine.h"
#include "slm/server/specialists.h"

namespace slm::server {

// Optional: ends a generation early by looking at its text. Called after each token with the text so far (what the
// client sees: stop strings already cut), where the text this token added starts, and the seconds since the first
// token; returns the length to keep (the rest
// is dropped and the generation ends with finish_reason "stop") or nullopt to go on. Text already taken by next()
// stays taken: a shorter length is raised to it. llama.cpp's n_indent and t_max_predict_ms are such limits.
using TextLimit =
    std::function<std::optional<size_t>(const std::string& text, size_t new_from, double since_first_token_s)>;

struct SessionResult {
  std::string finish_reason;  // "stop" (stop id, stop string or the TextLimit), "length", "cancelled", "error"
  std::string error;          // for "error"
  std::string stop_word;      // the stop string that ended it ("": none)
  bool text_limit = false;    // the TextLimit ended it
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the engine restored from its prefix cache
  double first_token_s = -1;  // seconds from the session's start to its first token (-1: none)
};

class Session {
 public:
  // Submits at once to the engine, whose ids the tokenizer reads (a specialist's, or a mixture's of specialists
  // sharing that tokenizer); throws engine::QueueFull or slm::Error (a request the engine refuses).
  Session(engine::Engine& engine, const data::Tokenizer& tokenizer, engine::Request request,
          std::vector<std::string> stop_strings, TextLimit limit = {});
  Session(Specialist& specialist, engine::Request request, std::vector<std::string> stop_strings)
      : Session(*specialist.engine, *specialist.tokenizer, std::move(request), std::move(stop_strings)) {}
  // Cancels the generation when it has not finished.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Waits at most `timeout` for text or the end; returns the text produced since the last call ("" if none yet).
  // done becomes true once everything has been returned and the generation has ended.
  std::string next(std::chrono::milliseconds timeout, bool& done);
  void cancel();
  // Valid once next() reported done.
  SessionResult result() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  engine::Engine& engine_;
  engine::RequestId id_ = 0;
};

}  // namespace slm::server
