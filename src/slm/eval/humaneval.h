#pragma once
// The HumanEval-C++ functional-correctness harness (`slm eval humaneval`): completions from a CompletionSource are
// cut at the problem's stop sequences, assembled into programs (problems.h), compiled with g++ and run in the
// sandbox, in parallel; the report holds pass@k (pass_at_k.h), the rates of each outcome and every sample's result.
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slm/eval/completions.h"
#include "slm/eval/problems.h"
#include "slm/eval/sandbox.h"
#include "slm/util/progress.h"

namespace slm::eval {

enum class Outcome { kPassed, kCompileError, kRuntimeError, kTimeout };
const char* outcome_name(Outcome o);  // "passed", "compile_error", "runtime_error", "timeout"

struct CompileOptions {
  std::string compiler = "g++";
  std::string standard = "c++17";  // what MultiPL-E's C++ problems are written for and judged with
  // Precompile each problem's leading block of #include <...> lines once and pre-include it (-include): the program
  // repeats those includes, so its meaning is the same; it only skips reparsing <bits/stdc++.h> (4x faster).
  bool pch = true;
  bool syntax_only = false;  // compile-pass (compile_pass.h): -fsyntax-only, and a program that compiles has passed
  std::vector<std::string> include_dirs;  // -I for every program (a held-out project's include directories)
  SandboxLimits limits{60, 60, 4ull << 30, 256ull << 20, 32, 1 << 20};  // the compiler: more time and memory
};

struct SampleResult {
  std::string completion;  // as judged: cut at the stop sequences
  Outcome outcome = Outcome::kRuntimeError;
  std::string detail;  // "exit status 134", "signal 6 (Aborted)", "compiler timed out", ...
  double compile_s = 0, run_s = 0;
  std::string stderr_head;  // the first bytes of the compiler's stderr (compile errors) or the program's
  std::string specialist;   // which of a server's specialists answered ("" for other sources)
};

struct ProblemResult {
  std::string name;
  std::vector<SampleResult> samples;
  int passed() const;
};

// Compiles and runs one program. Thread-safe; the temporary directory is removed with the Judge.
class Judge {
 public:
  Judge(const CompileOptions& compile, const SandboxLimits& run, Isolation isolation);
  ~Judge();
  Judge(const Judge&) = delete;
  Judge& operator=(const Judge&) = delete;

  SampleResult judge(const Problem& problem, const std::string& completion);
  const Sandbox& sandbox() const { return sandbox_; }
  const std::string& work_dir() const { return root_; }  // every program's directory lies under it
  std::string compile_command() const;                   // for the report
  std::vector<std::string> warnings() const;             // e.g. a precompiled header that could not be built

 private:
  struct Prelude;
  std::string prelude_flag(const std::string& prelude);  // "" or the -include path of a built PCH

  CompileOptions compile_;
  SandboxLimits run_;
  Sandbox sandbox_;
  std::string root_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Prelude>> preludes_;
  std::vector<std::string> warnings_;
  uint64_t next_dir_ = 0;
};

// The leading block of `#include <...>` lines of a prompt ("" when it starts otherwise), which the PCH holds.
std::string include_prelude(const std::string& prompt);

struct HumanEvalOptions {
  int n = 1;                      // samples per problem asked of a generating source (a file has its own count)
  std::vector<int> ks = {1, 10};  // pass@k reported for each k <= n
  int jobs = 0;                   // parallel compile+run jobs; 0: the number of cores
  CompileOptions compile;
  SandboxLimits run;
  Isolation isolation = Isolation::kNamespaces;
  std::string results_path;      // per-problem JSONL, one line as each problem finishes ("": none)
  std::string completions_path;  // every raw completion as {"task_id", "completion"} as produced ("": none)
};

struct HumanEvalReport {
  std::string problems_file, source, isolation, compile_command;
  bool compile_only = false;  // compile-pass (CompileOptions::syntax_only): pass@k counts completions that compile
  std::vector<ProblemResult> problems;  // in the problem file's order; problems without samples are left out
  std::vector<std::string> unscored;    // problems the source had no completions for
  std::map<int, double> pass_at_k;      // mean over problems with n >= k
  std::map<int, int> pass_at_k_problems;
  std::map<Outcome, int> outcomes;         // over every sample
  std::map<std::string, int> specialists;  // samples per specialist that answered (a server's; else empty)
  int samples = 0;
  double seconds = 0;
  std::vector<std::string> warnings;
  nlohmann::json summary_json() const;  // everything but the per-problem results
  std::string table() const;            // the readable summary
};

nlohmann::json problem_json(const ProblemResult& result, const std::vector<int>& ks);

// Runs the harness. progress (optional) sees (samples judged, samples expected).
HumanEvalReport run_humaneval(const std::string& problems_file, const std::vector<Problem>& problems,
                              CompletionSource& source, const HumanEvalOptions& options,
                              const ProgressFn& progress = {});

}  // namespace slm::eval
