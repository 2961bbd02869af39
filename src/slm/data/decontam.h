#pragma once
// Decontamination against evaluation problems (e.g. ../shared/eval/multipl-e/humaneval-cpp.jsonl, whose license
// forbids training on it): a document is contaminated when it shares any n-gram of code tokens (default 13,
// whitespace-insensitive) with an evaluation problem's prompt or tests. Preprocessor lines and
// `using namespace` lines of the problems are left out, since every problem shares them, and so are n-grams with
// fewer than 3 informative words (identifiers or words of 3+ characters that are not common C++ vocabulary such as
// std, vector, string, map, int, return): runs of punctuation, numbers and type names like
// "std::map<std::string, std::string>" or "1, 2, 3, 4, 5, 6, 7" occur in ordinary code.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace slm::data {

struct EvalProblem {
  std::string name;
  std::string text;  // prompt + tests
};

// Reads a MultiPL-E style .jsonl: "name", "prompt", "tests" per line. Throws slm::Error naming the file.
std::vector<EvalProblem> load_eval_problems(const std::string& jsonl_path);

class Decontaminator {
 public:
  explicit Decontaminator(const std::vector<EvalProblem>& problems, int ngram = 13, int min_informative = 3);
  struct Hit {
    bool contaminated = false;
    std::string problem;  // the first matching problem's name
    uint64_t matches = 0;  // matching n-gram positions in the document
  };
  Hit check(std::string_view text) const;
  size_t ngram_count() const { return grams_.size(); }
  int ngram() const { return n_; }

 private:
  int n_;
  std::unordered_map<uint64_t, uint32_t> grams_;  // n-gram hash -> problem index
  std::vector<std::string> names_;
};

}  // namespace slm::data
