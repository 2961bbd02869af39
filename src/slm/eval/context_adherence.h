#pragma once
// Context adherence and hallucination on held-out code (issue 18, `slm eval context`): a context-graph case gives
// the model a target function's callees and callers (whole definitions, data/callgraph.h) and the target's signature,
// and asks for its body. A completion adheres when it calls at least one of the provided callees; an identifier it
// uses is unknown (hallucinated) when it appears neither in the prompt, nor in the target's own file (its body
// removed), nor in the headers that file includes, nor in the standard library, nor among C++'s keywords, and the
// completion does not declare it itself. docs/evaluation.md has the exact rules and their limits.
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "slm/eval/compile_pass.h"
#include "slm/eval/completions.h"
#include "slm/eval/problems.h"

namespace slm::eval {

struct ContextCaseOptions {
  BodyCutOptions cut;  // which bodies are cut (as compile-pass); max_per_file applies per file
  // The whole prompt: the file's #include lines, the target's head and as many whole callee and caller definitions as
  // fit (a model trained on 1,024-token windows, and a server, take no longer prompt).
  size_t max_prompt_bytes = 2000;
  size_t max_cases = 0;  // 0: every case
};

struct ContextCase {
  Problem problem;                   // prompt: the file's #include lines, callees, callers, the target's head
  std::string body;                  // the original body
  std::string file;                  // the target's file, relative to the source root
  std::vector<std::string> callees;  // unqualified names of the callees shown in the prompt (at least one)
  size_t callers = 0;                // callers shown
};

// The cases of a source tree: each function that calls some other function of the tree and has a body split_body
// accepts, with as many of its callees (first) and callers as fit max_prompt_bytes; a target none of whose callees
// fit is skipped. Deterministic. Throws slm::Error when root is missing or holds no C++ file.
std::vector<ContextCase> make_context_cases(const std::string& root, const ContextCaseOptions& options = {});

// Identifiers of C++ text: comments, string and character literals, numbers and preprocessor lines are skipped.
std::vector<std::string> cpp_identifiers(const std::string& text);

struct AdherenceScore {
  bool calls_callee = false;
  std::vector<std::string> identifiers;  // distinct, used and not declared by the completion, keywords excluded
  std::vector<std::string> unknown;      // those of them `known` rejects
};

// A completion's score: a callee is called when its name is followed by '(' or by a template argument list and '('.
// An identifier counts as declared by the completion when it follows a type-like token (an identifier that is not a
// statement keyword, '>', '>>', '*', '&', '&&') and precedes one of = ; ( { , [ : ) — a heuristic that errs towards
// fewer unknowns (`a * b;` declares b).
AdherenceScore score_adherence(const std::string& completion, const std::vector<std::string>& callees,
                               const std::function<bool(const std::string&)>& known);

// Identifiers a completion may use besides its prompt's: the standard library's (the compiler's preprocessed
// <bits/stdc++.h>, or the standard headers one by one where that is missing), a file's includes' (the file's
// #include lines preprocessed with its directory and include_dirs on the path; lines that fail alone are left out)
// and the file's own text. Preprocessor runs are cached by their include lines. Thread-safe.
class KnownIdentifiers {
 public:
  KnownIdentifiers(std::string compiler, std::string standard, std::vector<std::string> include_dirs);
  const std::set<std::string>& standard_library();
  // The identifiers of the file's text and of what it includes; dir is the file's directory.
  std::set<std::string> of_file(const std::string& text, const std::string& dir);

 private:
  std::set<std::string> preprocess(const std::string& include_lines, const std::string& dir);
  std::string compiler_, standard_;
  std::vector<std::string> include_dirs_;
  std::mutex mu_;
  bool have_std_ = false;
  std::set<std::string> std_;
  std::map<std::string, std::set<std::string>> cache_;  // (dir + include line) -> identifiers
};

struct ContextReport {
  size_t cases = 0, completions = 0, adhering = 0, with_unknown = 0;
  uint64_t identifiers = 0, unknown = 0;
  std::map<std::string, size_t> specialists;  // a server's: which specialist answered how many completions
  double adherence() const { return completions ? static_cast<double>(adhering) / completions : 0; }
  double hallucination_rate() const { return identifiers ? static_cast<double>(unknown) / identifiers : 0; }
  nlohmann::json json() const;
};

// Asks source for n completions of every case (all at once, so a batching source generates them together), cuts them
// at the stop sequences and scores them; results_path (when not empty) gets one JSON line per completion. progress
// sees each finished case.
ContextReport run_context_adherence(const std::vector<ContextCase>& cases, CompletionSource& source, int n,
                                    KnownIdentifiers& known, const std::string& root,
                                    const std::string& results_path = "",
                                    const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace slm::eval
