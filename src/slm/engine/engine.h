#pragma once
// The in-process generation engine the server (and `slm chat`) talk to: requests of token ids in, tokens out
// through a callback as they are produced, cancellation at any time. The interface is deliberately narrow (ids,
// sampling options, limits, callbacks) so that the implementation behind it can change — continuous batching with
// CUDA graph decode steps (batch_engine.h), or one request at a time where the model refuses batched rows
// (decode_engine.h) — without touching its callers. Text (tokenizer, chat template, stop strings) stays outside.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "slm/util/error.h"

namespace slm::engine {

struct Sampling {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0: no limit
  uint64_t seed = 0;         // a fixed seed reproduces the same tokens
  // As model::SamplerOptions (model/sampler.h): repetition over the prompt and the output, the others the output.
  double repetition_penalty = 1.0;  // > 0; 1: none
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
};

struct Request {
  std::vector<int64_t> prompt;  // at least one id
  Sampling sampling;
  int64_t max_tokens = 16;              // at least 1
  std::vector<int64_t> stop_ids;        // generation ends when one of these is produced; it is not delivered
  std::vector<double> mixture_weights;  // a mixture engine's weight per model (empty: equal); others ignore it
  // Prompt lengths after which an engine with a prefix-state cache (the batch engine) should keep the state for later
  // requests, besides its own chunk boundaries and the prompt's end: a recurrent state cannot be rewound, so a later
  // prompt can start only from a point where a state was kept (the batch engine ends a prefill chunk at each, so the
  // state after exactly that many tokens exists). An editor's completion passes the end of the part that stays the
  // same while the user types (the extra context, the start of the cursor's line). Values outside (0, prompt.size()]
  // and duplicates are ignored, any order; engines without a cache ignore them all.
  std::vector<int64_t> cache_points{};  // {}: positional initializers may leave it out (-Wmissing-field-initializers)
};

enum class Finish { kLength, kStop, kCancelled, kError };
const char* finish_name(Finish f);  // "length", "stop", "cancelled", "error"

struct Result {
  Finish finish = Finish::kLength;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::string error;  // kError only
  // Of prompt_tokens, those whose state was restored from the prefix cache, not computed (0: a miss, or no cache).
  int64_t cached_tokens = 0;
};

// Both run on the engine's thread (on_done of a request cancelled before it started: in cancel()), so they must be
// quick (copy, queue, notify) and must not call submit(). on_done runs exactly once per accepted request, after its
// last on_token.
struct Callbacks {
  std::function<void(int64_t token)> on_token;
  std::function<void(const Result& result)> on_done;
};

using RequestId = uint64_t;

struct Stats {
  int64_t queued = 0;                // accepted, not started
  int64_t running = 0;               // being generated
  int64_t reused_prompt_tokens = 0;  // since the start: prompt tokens whose state was restored, not computed
  int64_t batched_prompts = 0;       // since the start: prompts whose first chunk ran in one forward with others
};

// submit() when the engine's queue is full: the caller should retry later (HTTP 503).
class QueueFull : public Error {
 public:
  using Error::Error;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Checks the request (throws slm::Error for an empty prompt, ids outside the vocabulary, max_tokens < 1,
  // prompt + max_tokens longer than context_length(), bad sampling options) and queues it; throws QueueFull when
  // the queue is full. Returns the id cancel() takes.
  virtual RequestId submit(Request request, Callbacks callbacks) = 0;
  // Ends the request soon with Finish::kCancelled (queued: before it starts; running: after the current token).
  // Finished or unknown ids are ignored.
  virtual void cancel(RequestId id) = 0;
  virtual Stats stats() const = 0;
  virtual int64_t context_length() const = 0;  // the longest prompt + max_tokens accepted
  virtual int64_t vocab_size() const = 0;
};

}  // namespace slm::engine
