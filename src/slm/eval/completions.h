#pragma once
// Where completions come from. The harness asks a CompletionSource for each problem's samples and judges them, so a
// file of ready completions, an in-process model (model_completions.h) and, later, a server's HTTP API all go
// through the same path.
#include <map>
#include <string>
#include <vector>

#include "slm/eval/problems.h"

namespace slm::eval {

class CompletionSource {
 public:
  virtual ~CompletionSource() = default;
  // One line for the report: what produced the completions.
  virtual std::string describe() const = 0;
  // How many samples complete() will return for the problem when asked for n.
  virtual int count(const Problem& problem, int n) const = 0;
  // The problem's completions (the text after its prompt; the harness cuts them at the stop sequences). Called from
  // one thread, problem after problem.
  virtual std::vector<std::string> complete(const Problem& problem, int n) = 0;
};

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
  std::vector<std::string> complete(const Problem& problem, int n) override;

 private:
  std::string path_;
  std::map<std::string, std::vector<std::string>> by_task_;
  size_t lines_ = 0;
};

}  // namespace slm::eval
