// The judge on real HumanEval-C++ problems with planted completions: what passes, what fails and how, and that
// hostile completions are contained; then a whole run over a file of completions, and the CLI.
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "eval_test_util.h"
#include "slm/eval/completions.h"
#include "slm/eval/humaneval.h"

using namespace slm;
using namespace slm::test;

namespace {

eval::Isolation best_isolation() {
  return eval::Sandbox::probe().empty() ? eval::Isolation::kNamespaces : eval::Isolation::kNone;
}

// Test programs get 3 s: enough for the asserts of these problems many times over on a loaded machine.
eval::SandboxLimits quick_limits() {
  eval::SandboxLimits l;
  l.wall_s = 3;
  l.cpu_s = 3;
  return l;
}

// How long a judged program may take before the test calls the sandbox broken: far past its 3 s limits plus the
// sandbox's 2 s kill escalation, so a loaded machine never trips it. The verdicts are asserted by their cause
// (the outcome and its detail); this bound only catches a kill that never came.
constexpr double kSafetyDeadlineS = 30.0;

// A timeout's detail names the limit that ended it: the wall clock or RLIMIT_CPU (which of the two 3 s limits comes
// first depends on how much CPU the program got).
bool names_a_time_limit(const std::string& detail) {
  return detail.rfind("wall-clock limit (3", 0) == 0 || detail.rfind("CPU time limit (3 s)", 0) == 0;
}

// Without the precompiled header: each test case runs in a process of its own (ctest), so one built per case would
// cost more than it saves. JudgePrecompiledHeader covers it.
eval::CompileOptions plain_compile() {
  eval::CompileOptions c;
  c.pch = false;
  return c;
}

// Processes whose command line lies under dir (the judge's programs); none may outlive judge().
// The JSON object in the CLI's output (stderr's notes and progress come before or after it).
nlohmann::json json_in(const std::string& out) {
  const size_t begin = out.find("{\n"), end = out.rfind("\n}");
  if (begin == std::string::npos || end == std::string::npos) throw Error("no JSON in: " + out);
  return nlohmann::json::parse(out.substr(begin, end + 2 - begin));
}

int processes_under(const std::string& dir) {
  int n = 0;
  DIR* proc = opendir("/proc");
  while (dirent* e = readdir(proc)) {
    std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), {});
    if (cmd.rfind(dir, 0) == 0) ++n;
  }
  closedir(proc);
  return n;
}

}  // namespace

TEST(HumanEvalJudge, CorrectSolutionPassesAndIsCutAtTheStopSequence) {
  SLM_REQUIRE_HUMANEVAL();
  eval::Judge judge(plain_compile(), quick_limits(), best_isolation());
  // What a model writes past the function is cut at "\n}"; left in, the second main() would not compile.
  const auto r = judge.judge(humaneval_problem("HumanEval_53_add"), "    return x + y;\n}\nint main() { return 1; }\n");
  EXPECT_EQ(r.outcome, eval::Outcome::kPassed) << r.detail << "\n" << r.stderr_head;
  EXPECT_EQ(r.completion, "    return x + y;");
}

TEST(HumanEvalJudge, WrongSolutionFailsItsAsserts) {
  SLM_REQUIRE_HUMANEVAL();
  eval::Judge judge(plain_compile(), quick_limits(), best_isolation());
  const auto r = judge.judge(humaneval_problem("HumanEval_53_add"), "    return x - y;");
  EXPECT_EQ(r.outcome, eval::Outcome::kRuntimeError);
  EXPECT_EQ(r.detail, "signal 6 (Aborted)");  // assert() aborts
  EXPECT_NE(r.stderr_head.find("Assertion"), std::string::npos) << r.stderr_head;
}

TEST(HumanEvalJudge, CompileErrorIsReportedWithTheCompilersMessage) {
  SLM_REQUIRE_HUMANEVAL();
  eval::Judge judge(plain_compile(), quick_limits(), best_isolation());
  const auto r = judge.judge(humaneval_problem("HumanEval_53_add"), "    return x +;");
  EXPECT_EQ(r.outcome, eval::Outcome::kCompileError);
  EXPECT_EQ(r.detail, "compiler exit status 1");
  EXPECT_NE(r.stderr_head.find("error: expected primary-expression"), std::string::npos) << r.stderr_head;
  EXPECT_EQ(r.run_s, 0.0);
}

TEST(HumanEvalJudge, InfiniteLoopTimesOutWithinTheLimit) {
  SLM_REQUIRE_HUMANEVAL();
  eval::Judge judge(plain_compile(), quick_limits(), best_isolation());
  const auto r = judge.judge(humaneval_problem("HumanEval_23_strlen"), "    for (;;) {}");
  EXPECT_EQ(r.outcome, eval::Outcome::kTimeout) << r.detail;
  EXPECT_TRUE(names_a_time_limit(r.detail)) << r.detail;
  // Both limits take 3 s of wall time at least (the deadline is checked in whole milliseconds: 2.9).
  EXPECT_GE(r.run_s, 2.9) << "killed before either limit";
  EXPECT_LT(r.run_s, kSafetyDeadlineS);
  EXPECT_EQ(processes_under(judge.work_dir()), 0);
}

TEST(HumanEvalJudge, ForkBombIsContained) {
  SLM_REQUIRE_HUMANEVAL();
  eval::Judge judge(plain_compile(), quick_limits(), best_isolation());
  // The completion closes the function mid-line (so "\n}" does not cut it), brings in fork() and opens a dummy
  // function that the tests' closing brace ends.
  const std::string bomb =
      "    int slm_bomb(); return slm_bomb(); }\n#include <unistd.h>\n"
      "int slm_bomb() { for (;;) fork(); return 0; } int slm_rest() {\n    return 0;";
  const auto r = judge.judge(humaneval_problem("HumanEval_53_add"), bomb);
  EXPECT_EQ(r.outcome, eval::Outcome::kTimeout) << r.detail << r.stderr_head;
  EXPECT_TRUE(names_a_time_limit(r.detail)) << r.detail;
  EXPECT_LT(r.run_s, kSafetyDeadlineS);
  EXPECT_EQ(processes_under(judge.work_dir()), 0) << "processes of the fork bomb survived";
  // The machine still forks.
  EXPECT_EQ(system("true"), 0);
}

TEST(HumanEvalJudge, HugeAllocationFailsInsideTheSandbox) {
  SLM_REQUIRE_HUMANEVAL();
  eval::Judge judge(plain_compile(), quick_limits(), best_isolation());
  // 64 GiB: std::bad_alloc under the 1 GiB address-space limit, long before the machine's memory matters.
  const auto r = judge.judge(humaneval_problem("HumanEval_53_add"),
                             "    std::vector<char> v(size_t(64) << 30, 1);\n    return v[7] + x + y;");
  EXPECT_EQ(r.outcome, eval::Outcome::kRuntimeError) << r.detail;
  EXPECT_EQ(r.detail, "signal 6 (Aborted)");  // the uncaught std::bad_alloc: std::terminate, not a limit's kill
  EXPECT_NE(r.stderr_head.find("bad_alloc"), std::string::npos) << r.stderr_head;
  EXPECT_LT(r.run_s, kSafetyDeadlineS);
}

TEST(HumanEvalJudge, HugeOutputIsCapped) {
  SLM_REQUIRE_HUMANEVAL();
  auto limits = quick_limits();
  limits.output_bytes = 64 << 10;
  eval::Judge judge(plain_compile(), limits, best_isolation());
  const auto r =
      judge.judge(humaneval_problem("HumanEval_53_add"), "    for (;;) std::cout << \"0123456789abcdef\\n\";");
  EXPECT_EQ(r.outcome, eval::Outcome::kRuntimeError) << r.detail;
  EXPECT_EQ(r.detail, "output passed 65536 bytes");  // the cap killed it, not a time limit
  EXPECT_LT(r.run_s, kSafetyDeadlineS);
}

TEST(HumanEvalJudgePrecompiledHeader, GivesTheSameVerdicts) {
  SLM_REQUIRE_HUMANEVAL();
  eval::Judge judge(eval::CompileOptions{}, quick_limits(), best_isolation());
  const auto problem = humaneval_problem("HumanEval_53_add");
  EXPECT_EQ(judge.judge(problem, "    return x + y;").outcome, eval::Outcome::kPassed);
  EXPECT_EQ(judge.judge(problem, "    return x * y;").outcome, eval::Outcome::kRuntimeError);
  EXPECT_EQ(judge.judge(problem, "    return x +;").outcome, eval::Outcome::kCompileError);
  EXPECT_TRUE(judge.warnings().empty()) << judge.warnings().front();
}

TEST(HumanEvalRun, ScoresAFileOfCompletions) {
  SLM_REQUIRE_HUMANEVAL();
  std::vector<eval::Problem> problems = {humaneval_problem("HumanEval_53_add"),
                                         humaneval_problem("HumanEval_23_strlen"),
                                         humaneval_problem("HumanEval_0_has_close_elements")};
  const std::string file =
      write_temp("completions.jsonl", R"({"task_id": "HumanEval_53_add", "completion": "    return x + y;\n}\n"}
{"task_id": "HumanEval_53_add", "completion": "    return x * y;"}
{"task_id": "HumanEval_23_strlen", "completion": "    return string.size();"}
{"task_id": "HumanEval_23_strlen", "completion": "    return (long)string.length();"}
)");
  eval::CompletionsFile source(file, problems);
  eval::HumanEvalOptions o;
  o.ks = {1, 2, 10};
  o.jobs = 2;
  o.compile.pch = false;
  o.run = quick_limits();
  o.isolation = best_isolation();
  o.results_path = testing::TempDir() + "/" + std::to_string(getpid()) + "_results.jsonl";
  uint64_t last = 0, total = 0;
  const auto rep = eval::run_humaneval("problems.jsonl", problems, source, o, [&](uint64_t d, uint64_t t) {
    last = d;
    total = t;
  });
  EXPECT_EQ(last, 4u);
  EXPECT_EQ(total, 4u);
  ASSERT_EQ(rep.problems.size(), 2u);
  EXPECT_EQ(rep.unscored, std::vector<std::string>{"HumanEval_0_has_close_elements"});
  EXPECT_EQ(rep.samples, 4);
  // add: 1 of 2 passes, strlen: 2 of 2. pass@1 = (1/2 + 1) / 2; pass@2 = (1 + 1) / 2; pass@10 needs n >= 10.
  EXPECT_DOUBLE_EQ(rep.pass_at_k.at(1), 0.75);
  EXPECT_DOUBLE_EQ(rep.pass_at_k.at(2), 1.0);
  EXPECT_EQ(rep.pass_at_k.count(10), 0u);
  EXPECT_EQ(rep.outcomes.at(eval::Outcome::kPassed), 3);
  EXPECT_EQ(rep.outcomes.at(eval::Outcome::kRuntimeError), 1);
  const auto summary = rep.summary_json();
  EXPECT_DOUBLE_EQ(summary["rates"]["runtime_error"].get<double>(), 0.25);
  EXPECT_EQ(summary["outcomes"]["compile_error"], 0);
  std::ifstream in(o.results_path);
  std::map<std::string, nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    lines[j["task_id"]] = j;
  }
  ASSERT_EQ(lines.size(), 2u);
  const auto& add = lines["HumanEval_53_add"];
  EXPECT_EQ(add["n"], 2);
  EXPECT_EQ(add["c"], 1);
  EXPECT_EQ(add["samples"][0]["status"], "passed");
  EXPECT_EQ(add["samples"][0]["completion"], "    return x + y;");
  EXPECT_EQ(add["samples"][1]["status"], "runtime_error");
  EXPECT_DOUBLE_EQ(add["pass_at_k"]["2"].get<double>(), 1.0);
  EXPECT_EQ(lines["HumanEval_23_strlen"]["c"], 2);
}

TEST(HumanEvalCli, ScoresCompletionsAndNamesTheBadLine) {
  SLM_REQUIRE_HUMANEVAL();
  const std::string out = testing::TempDir() + "/" + std::to_string(getpid()) + "_cli_out";
  const std::string good =
      write_temp("cli.jsonl", R"({"task_id": "HumanEval_53_add", "completion": "    return y + x;"})");
  auto r = run_slm("eval humaneval --problems " + humaneval_file() + " --completions " + good +
                   " --tasks HumanEval_53_add --no-pch --jobs 1 --json --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = json_in(r.out);
  EXPECT_DOUBLE_EQ(j["pass_at_k"]["1"].get<double>(), 1.0);
  EXPECT_EQ(j["samples"], 1);
  EXPECT_EQ(::access((out + "/results.jsonl").c_str(), R_OK), 0);
  EXPECT_EQ(::access((out + "/summary.json").c_str(), R_OK), 0);

  const std::string bad =
      write_temp("cli-bad.jsonl", R"({"task_id": "HumanEval_53_add", "completion": "    return y + x;"}
{"task_id": "HumanEval_53_add", "completion": )");
  r = run_slm("eval humaneval --problems " + humaneval_file() + " --completions " + bad + " --out ''");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("cli-bad.jsonl:2: not a JSON value"), std::string::npos) << r.out;
  r = run_slm("eval humaneval --problems /nonexistent.jsonl --completions " + good);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent.jsonl: cannot read the problem file"), std::string::npos) << r.out;
}

TEST(HumanEvalCli, GeneratesWithAnInProcessModel) {
  SLM_REQUIRE_HUMANEVAL();
  const std::string out = testing::TempDir() + "/" + std::to_string(getpid()) + "_model_out";
  // A tiny recipe with random weights (no checkpoint): the path from prompt to judged program, not the quality.
  auto r =
      run_slm("eval humaneval --problems " + humaneval_file() + " --recipe " + source_path("recipes/tiny-ae.json") +
              " --tasks HumanEval_53_add,HumanEval_23_strlen --max-tokens 6 --no-pch --json --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("RANDOM"), std::string::npos) << r.out;
  const auto j = json_in(r.out);
  EXPECT_EQ(j["samples"], 2);
  EXPECT_EQ(j["problems"], 2);
  std::ifstream in(out + "/completions.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    const auto c = nlohmann::json::parse(line);
    EXPECT_TRUE(c.contains("task_id") && c.contains("completion"));
    ++lines;
  }
  EXPECT_EQ(lines, 2);
}
