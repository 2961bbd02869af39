#pragma once
// Where completions come from. The harness asks a CompletionSource for every problem's samples at once and judges
// each problem's as soon as they are all there, so a file of ready completions, an in-process model
// (model_completions.h) and a server's HTTP API (server_completions.h) all go through the same path, and the
// generating ones can work on many samples (of several problems) together.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "slm/eval/problems.h"

namespace slm::eval {

struct Completion {
  std::string text;        // after the prompt; the harness cuts it at the stop sequences
  std::string specialist;  // which of a server's specialists answered ("" for other sources)
  bool operator==(const Completion&) const = default;
};

// What a generating source asks of each sample.
struct SamplingSpec {
  int64_t max_tokens = 256;
  double temperature = 0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;            // 0: no limit
  uint64_t seed = 0;            // sample j of a problem uses sample_seed(seed, problem, j): any subset reproduces
  size_t max_prompt_bytes = 0;  // the model sees the prompt's last lines within this many bytes (0: all of it)
};

uint64_t sample_seed(uint64_t seed, const Problem& problem, int j);
// What the model is shown of a prompt: all of it within max_bytes (0: no limit), else its end from the first line
// that starts within the last max_bytes (a model trained on 1,024-token windows gains nothing from a longer file
// prefix, and a server refuses a prompt longer than its context). The program judged keeps the whole prompt.
std::string prompt_tail(const std::string& prompt, size_t max_bytes);
// "greedy, up to 256 tokens", "temperature 0.8, top-p 0.95, up to 256 tokens", ... for describe().
std::string describe_sampling(const SamplingSpec& sampling);

// Receives one problem's completions (its index in the problems given to complete()); false stops the run early.
using DeliverFn = std::function<bool(size_t problem, std::vector<Completion> completions)>;

class CompletionSource {
 public:
  virtual ~CompletionSource() = default;
  // One line for the report: what produced the completions.
  virtual std::string describe() const = 0;
  // How many samples complete() will deliver for the problem when asked for n.
  virtual int count(const Problem& problem, int n) const = 0;
  // Every problem's completions, handed to deliver on the calling thread, in problem order, as soon as each
  // problem's are all there; problems without any are skipped. Returns once all are delivered or deliver returned
  // false. Throws slm::Error when generation fails.
  virtual void complete(const std::vector<Problem>& problems, int n, const DeliverFn& deliver) = 0;
  // One problem's completions.
  std::vector<Completion> complete(const Problem& problem, int n);
};

// The scheduling of the generating sources: sample(problem, j) for every j < n of every problem, run on `parallel`
// threads that take the samples in problem order, so up to `parallel` are in flight at once (a batching engine or
// server generates them together). Delivery as CompletionSource::complete. After the first exception of sample, or
// once deliver returned false, no sample starts; the exception is rethrown when those in flight are done.
void complete_concurrently(const std::vector<Problem>& problems, int n, int parallel,
                           const std::function<Completion(size_t problem, int j)>& sample, const DeliverFn& deliver);

// Completions produced elsewhere: JSONL with one sample per line, {"task_id": NAME, "completion": TEXT} ("name" is
// accepted for "task_id", as MultiPL-E's problem files call it); other fields are ignored. Every line of a problem is
// one of its samples, in file order, whatever n asks for.
class CompletionsFile : public CompletionSource {
 public:
  // Throws slm::Error naming the file and line for a malformed line, a missing field, or a task id that is not
  // among `problems`.
  CompletionsFile(const std::string& path, const std::vector<Problem>& problems);
  std::string describe() const override;
  int count(const Problem& problem, int n) const override;
  using CompletionSource::complete;
  void complete(const std::vector<Problem>& problems, int n, const DeliverFn& deliver) override;

 private:
  std::string path_;
  std::map<std::string, std::vector<std::string>> by_task_;
  size_t lines_ = 0;
};

}  // namespace slm::eval
