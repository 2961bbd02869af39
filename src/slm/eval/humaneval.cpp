#include "slm/eval/humaneval.h"

#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <thread>

#include "slm/eval/pass_at_k.h"
#include "slm/eval/stop.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::eval {

namespace {

constexpr size_t kStderrHead = 2048;

// One JSONL line. Completions and program output are bytes: invalid UTF-8 (a byte-level model emits it freely)
// becomes U+FFFD in the file; the judged program had the bytes themselves.
std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string head(const std::string& s) {
  return s.substr(0, kStderrHead);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw Error(path + ": cannot write (" + std::strerror(errno) + ")");
}

void make_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0) throw Error(path + ": cannot create (" + std::strerror(errno) + ")");
}

std::string percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * v);
  return buf;
}

}  // namespace

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kPassed: return "passed";
    case Outcome::kCompileError: return "compile_error";
    case Outcome::kRuntimeError: return "runtime_error";
    case Outcome::kTimeout: return "timeout";
  }
  return "?";
}

int ProblemResult::passed() const {
  int c = 0;
  for (const auto& s : samples) c += s.outcome == Outcome::kPassed;
  return c;
}

std::string include_prelude(const std::string& prompt) {
  std::string out;
  size_t p = 0;
  while (p < prompt.size()) {
    size_t e = prompt.find('\n', p);
    if (e == std::string::npos) break;  // the signature line: never part of the prelude
    const std::string line = prompt.substr(p, e - p);
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line.compare(i, 8, "#include") != 0) break;
    i = line.find_first_not_of(" \t", i + 8);
    if (i == std::string::npos || line[i] != '<') break;
    out += line + "\n";
    p = e + 1;
  }
  return out;
}

struct Judge::Prelude {
  std::once_flag built;
  std::string include;  // the header to pre-include ("" when its PCH failed)
};

Judge::Judge(const CompileOptions& compile, const SandboxLimits& run, Isolation isolation)
    : compile_(compile), run_(run), sandbox_(isolation) {
  if (find_program(compile_.compiler).empty()) throw Error(compile_.compiler + ": compiler not found on PATH");
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/slm-humaneval-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw Error(tmpl + ": cannot create a temporary directory (" + std::strerror(errno) + ")");
  root_ = tmpl;
  // The sandbox's user (nobody when the harness runs as root) must reach the program directories inside.
  chmod(root_.c_str(), 0755);
}

Judge::~Judge() {
  try {
    remove_tree(root_);
  } catch (const Error&) {
    // A leftover temporary directory is not worth a crash while unwinding.
  }
}

std::string Judge::compile_command() const {
  return compile_.compiler + " -std=" + compile_.standard +
         (compile_.syntax_only ? " -fsyntax-only prog.cpp" : " -o prog prog.cpp") +
         (compile_.pch ? " (with the leading #include <...> block precompiled and pre-included)" : "");
}

std::vector<std::string> Judge::warnings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warnings_;
}

std::string Judge::prelude_flag(const std::string& prelude) {
  if (prelude.empty()) return "";
  std::shared_ptr<Prelude> entry;
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& e = preludes_[prelude];
    if (!e) e = std::make_shared<Prelude>();
    entry = e;
    index = preludes_.size();
  }
  std::call_once(entry->built, [&] {
    const std::string dir = root_ + "/pch-" + std::to_string(index);
    make_dir(dir);
    write_text(dir + "/prelude.h", prelude);
    const auto r = sandbox_.run(
        {compile_.compiler, "-std=" + compile_.standard, "-x", "c++-header", "prelude.h", "-o", "prelude.h.gch"}, dir,
        compile_.limits);
    if (r.ok()) {
      entry->include = dir + "/prelude.h";
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      warnings_.push_back("the precompiled header of \"" + prelude.substr(0, prelude.find('\n')) +
                          "...\" did not build; its programs compile without it: " + head(r.err));
    }
  });
  return entry->include;
}

SampleResult Judge::judge(const Problem& problem, const std::string& completion) {
  SampleResult s;
  s.completion = truncate_at_stop(completion, problem.stop_tokens);
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = root_ + "/s" + std::to_string(next_dir_++);
  }
  make_dir(dir);
  write_text(dir + "/prog.cpp", program_text(problem, s.completion));
  std::vector<std::string> cc = {compile_.compiler, "-std=" + compile_.standard};
  for (const auto& d : problem.quote_dirs) cc.insert(cc.end(), {"-iquote", d});
  for (const auto& d : compile_.include_dirs) cc.insert(cc.end(), {"-I", d});
  if (compile_.pch)
    if (auto include = prelude_flag(include_prelude(problem.prompt)); !include.empty())
      cc.insert(cc.end(), {"-include", include});
  if (compile_.syntax_only)
    cc.insert(cc.end(), {"-fsyntax-only", "prog.cpp"});
  else
    cc.insert(cc.end(), {"-o", "prog", "prog.cpp"});
  const auto c = sandbox_.run(cc, dir, compile_.limits);
  s.compile_s = c.seconds;
  if (!c.ok()) {
    s.outcome = Outcome::kCompileError;
    s.stderr_head = head(c.err);
    s.detail = c.timed_out         ? "the compiler timed out"
               : c.output_exceeded ? "the compiler's output passed the cap"
               : c.exit_code >= 0  ? "compiler exit status " + std::to_string(c.exit_code)
                                   : "the compiler died of signal " + std::to_string(c.signal);
  } else if (compile_.syntax_only) {
    s.outcome = Outcome::kPassed;
  } else {
    const auto r = sandbox_.run({dir + "/prog"}, dir, run_);
    s.run_s = r.seconds;
    s.stderr_head = head(r.err);
    if (r.ok()) {
      s.outcome = Outcome::kPassed;
    } else if (r.timed_out || r.cpu_exceeded) {
      s.outcome = Outcome::kTimeout;
      s.detail = r.timed_out ? "wall-clock limit (" + std::to_string(run_.wall_s) + " s)"
                             : "CPU time limit (" + std::to_string(run_.cpu_s) + " s)";
    } else {
      s.outcome = Outcome::kRuntimeError;
      s.detail = r.output_exceeded  ? "output passed " + std::to_string(run_.output_bytes) + " bytes"
                 : r.exit_code >= 0 ? "exit status " + std::to_string(r.exit_code)
                                    : "signal " + std::to_string(r.signal) + " (" + strsignal(r.signal) + ")";
    }
  }
  remove_tree(dir);
  return s;
}

nlohmann::json problem_json(const ProblemResult& r, const std::vector<int>& ks) {
  const int n = static_cast<int>(r.samples.size());
  nlohmann::json j = {{"task_id", r.name}, {"n", n}, {"c", r.passed()}};
  j["pass_at_k"] = nlohmann::json::object();
  for (int k : ks)
    if (k <= n) j["pass_at_k"][std::to_string(k)] = pass_at_k(n, r.passed(), k);
  j["samples"] = nlohmann::json::array();
  for (const auto& s : r.samples) {
    j["samples"].push_back({{"status", outcome_name(s.outcome)},
                            {"detail", s.detail},
                            {"compile_s", s.compile_s},
                            {"run_s", s.run_s},
                            {"stderr_head", s.stderr_head},
                            {"completion", s.completion}});
    if (!s.specialist.empty()) j["samples"].back()["specialist"] = s.specialist;
  }
  return j;
}

nlohmann::json HumanEvalReport::summary_json() const {
  nlohmann::json j = {{"problems_file", problems_file},
                      {"source", source},
                      {"isolation", isolation},
                      {"compile_command", compile_command},
                      {"compile_only", compile_only},
                      {"problems", problems.size()},
                      {"samples", samples},
                      {"unscored", unscored},
                      {"seconds", seconds},
                      {"warnings", warnings}};
  j["specialists"] = nlohmann::json::object();
  for (const auto& [name, count] : specialists) j["specialists"][name] = count;
  j["pass_at_k"] = nlohmann::json::object();
  for (const auto& [k, v] : pass_at_k) j["pass_at_k"][std::to_string(k)] = v;
  j["pass_at_k_problems"] = nlohmann::json::object();
  for (const auto& [k, v] : pass_at_k_problems) j["pass_at_k_problems"][std::to_string(k)] = v;
  j["outcomes"] = nlohmann::json::object();
  j["rates"] = nlohmann::json::object();
  for (auto o : {Outcome::kPassed, Outcome::kCompileError, Outcome::kRuntimeError, Outcome::kTimeout}) {
    const int count = outcomes.count(o) ? outcomes.at(o) : 0;
    j["outcomes"][outcome_name(o)] = count;
    j["rates"][outcome_name(o)] = samples ? static_cast<double>(count) / samples : 0.0;
  }
  return j;
}

std::string HumanEvalReport::table() const {
  std::string t;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu problems, %d samples, sandbox %s, %.1f s\n", problems.size(), samples,
                isolation.c_str(), seconds);
  t += std::string(compile_only ? "Compile-pass" : "HumanEval-C++") + " (" + problems_file + "): " + buf;
  t += "completions: " + source + "\n";
  if (!specialists.empty()) {
    t += "answered by:";
    for (const auto& [name, count] : specialists) t += " " + name + " " + std::to_string(count) + " samples,";
    t.back() = '\n';
  }
  t += "compiled as: " + compile_command + "\n\n";
  for (const auto& [k, v] : pass_at_k) {
    std::snprintf(buf, sizeof buf, "pass@%-4d %8s   (%d problems)\n", k, percent(v).c_str(), pass_at_k_problems.at(k));
    t += buf;
  }
  std::snprintf(buf, sizeof buf, "\n%-15s %8s %9s\n", "outcome", "samples", "rate");
  t += buf;
  for (auto o : {Outcome::kPassed, Outcome::kCompileError, Outcome::kRuntimeError, Outcome::kTimeout}) {
    const int count = outcomes.count(o) ? outcomes.at(o) : 0;
    std::snprintf(buf, sizeof buf, "%-15s %8d %9s\n", outcome_name(o), count,
                  percent(samples ? static_cast<double>(count) / samples : 0.0).c_str());
    t += buf;
  }
  if (!unscored.empty()) t += "\n" + std::to_string(unscored.size()) + " problems had no completions (not scored)\n";
  for (const auto& w : warnings) t += "warning: " + w + "\n";
  return t;
}

HumanEvalReport run_humaneval(const std::string& problems_file, const std::vector<Problem>& problems,
                              CompletionSource& source, const HumanEvalOptions& o, const ProgressFn& progress) {
  if (o.n < 1) throw Error("--n must be at least 1");
  for (int k : o.ks)
    if (k < 1) throw Error("--k values must be at least 1 (got " + std::to_string(k) + ")");
  const auto start = std::chrono::steady_clock::now();
  Judge judge(o.compile, o.run, o.isolation);
  auto open_out = [](const std::string& path) {
    std::ofstream f;
    if (path.empty()) return f;
    make_parent_dirs(path);
    f.open(path, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(path + ": cannot write (" + std::strerror(errno) + ")");
    return f;
  };
  std::ofstream results_out = open_out(o.results_path), completions_out = open_out(o.completions_path);

  uint64_t expected = 0;
  for (const auto& p : problems) expected += static_cast<uint64_t>(source.count(p, o.n));
  std::vector<ProblemResult> results(problems.size());
  std::vector<int> remaining(problems.size(), 0);
  std::vector<bool> scored(problems.size(), false);

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<size_t, size_t>> queue;  // (problem, sample)
  bool producing = true;
  std::exception_ptr failure;
  uint64_t judged = 0;
  auto worker = [&] {
    for (;;) {
      std::pair<size_t, size_t> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !queue.empty() || !producing || failure; });
        if (failure || queue.empty()) return;
        task = queue.front();
        queue.pop_front();
      }
      const auto& [pi, si] = task;
      try {
        SampleResult r = judge.judge(problems[pi], results[pi].samples[si].completion);
        std::lock_guard<std::mutex> lock(mu);
        r.specialist = std::move(results[pi].samples[si].specialist);
        results[pi].samples[si] = std::move(r);
        if (--remaining[pi] == 0 && results_out.is_open()) {
          results_out << json_line(problem_json(results[pi], o.ks)) << std::flush;
          if (!results_out) throw Error(o.results_path + ": write failed (" + std::strerror(errno) + ")");
        }
        ++judged;
        if (progress) progress(judged, expected);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        cv.notify_all();
        return;
      }
    }
  };
  const int jobs = o.jobs > 0 ? o.jobs : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> workers;
  for (int i = 0; i < jobs; ++i) workers.emplace_back(worker);
  auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      producing = false;
    }
    cv.notify_all();
    for (auto& w : workers) w.join();
  };
  try {
    source.complete(problems, o.n, [&](size_t pi, std::vector<Completion> completions) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (failure) return false;
      }
      if (completions.empty()) return true;
      for (const auto& c : completions)
        if (completions_out.is_open())
          completions_out << json_line({{"task_id", problems[pi].name}, {"completion", c.text}});
      if (completions_out.is_open() && !completions_out.flush())
        throw Error(o.completions_path + ": write failed (" + std::strerror(errno) + ")");
      std::lock_guard<std::mutex> lock(mu);
      results[pi].name = problems[pi].name;
      results[pi].samples.resize(completions.size());
      for (size_t si = 0; si < completions.size(); ++si) {
        results[pi].samples[si].completion = std::move(completions[si].text);
        results[pi].samples[si].specialist = std::move(completions[si].specialist);
        queue.emplace_back(pi, si);
      }
      remaining[pi] = static_cast<int>(completions.size());
      scored[pi] = true;
      cv.notify_all();
      return true;
    });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!failure) failure = std::current_exception();
    }
    finish();
    std::rethrow_exception(failure);
  }
  finish();
  if (failure) std::rethrow_exception(failure);

  HumanEvalReport rep;
  rep.problems_file = problems_file;
  rep.source = source.describe();
  rep.isolation = isolation_name(judge.sandbox().isolation());
  rep.compile_command = judge.compile_command();
  rep.compile_only = o.compile.syntax_only;
  rep.warnings = judge.warnings();
  for (size_t pi = 0; pi < problems.size(); ++pi) {
    if (!scored[pi]) {
      rep.unscored.push_back(problems[pi].name);
      continue;
    }
    for (const auto& s : results[pi].samples) {
      ++rep.outcomes[s.outcome];
      if (!s.specialist.empty()) ++rep.specialists[s.specialist];
    }
    rep.samples += static_cast<int>(results[pi].samples.size());
    rep.problems.push_back(std::move(results[pi]));
  }
  for (int k : o.ks) {
    double sum = 0;
    int count = 0;
    for (const auto& r : rep.problems) {
      const int n = static_cast<int>(r.samples.size());
      if (n < k) continue;
      sum += pass_at_k(n, r.passed(), k);
      ++count;
    }
    if (count == 0) {
      rep.warnings.push_back("pass@" + std::to_string(k) + " needs at least " + std::to_string(k) +
                             " samples per problem (--n)");
      continue;
    }
    rep.pass_at_k[k] = sum / count;
    rep.pass_at_k_problems[k] = count;
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rep;
}

}  // namespace slm::eval
