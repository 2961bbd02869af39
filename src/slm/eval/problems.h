#pragma once
// MultiPL-E problem files (JSONL, one problem per line): HumanEval-C++ and any other set of the same format.
// A program is prompt + completion (cut at the first stop sequence) + "\n" + tests; it passes when it compiles and
// exits with status 0.
#include <string>
#include <vector>

namespace slm::eval {

struct Problem {
  std::string name;                      // task id, e.g. "HumanEval_0_has_close_elements"
  std::string prompt;                    // includes, doc comment and the signature line ending in '{'
  std::string tests;                     // closes the function and holds main() with the asserts
  std::vector<std::string> stop_tokens;  // the completion ends before the first of these
  std::vector<std::string> quote_dirs;   // -iquote directories (a problem cut from a file: the file's own)
};

// Reads every line (blank lines are skipped). Throws slm::Error naming the file and line for a malformed line, a
// missing or mistyped field (name, prompt, tests, stop_tokens) or a repeated name; other fields are ignored.
std::vector<Problem> load_problems(const std::string& path);

// The program that is compiled and run for one completion (already cut at the stop sequences).
std::string program_text(const Problem& problem, const std::string& completion);

}  // namespace slm::eval
