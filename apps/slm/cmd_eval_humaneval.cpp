// slm eval humaneval: functional correctness (pass@k) on MultiPL-E's HumanEval-C++ or any problem file of its format;
// slm eval compile-pass: the share of function bodies, completed in held-out files, with which the file compiles;
// slm eval context: context adherence and hallucination of bodies completed from their callees and callers.
#include <torch/torch.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>

#include "commands.h"
#include "slm/eval/compile_pass.h"
#include "slm/eval/completions.h"
#include "slm/eval/context_adherence.h"
#include "slm/eval/humaneval.h"
#include "slm/eval/model_completions.h"
#include "slm/eval/server_completions.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/progress.h"

namespace slm::cli {

namespace {

struct HumanEvalCli {
  std::string problems = "../shared/eval/multipl-e/humaneval-cpp.jsonl";  // relative to the repository root
  std::string completions;
  eval::ModelSpec model;    // model.checkpoint may be a server's URL
  eval::ServerSpec server;  // its url and sampling come from model
  double temperature = -1;  // -1: greedy for --n 1, else 0.8
  eval::HumanEvalOptions run;
  std::string sandbox = "auto";
  double memory_mb = 1024, max_output_kb = 1024;
  std::vector<std::string> tasks;
  int limit = 0;
  std::string out = "out/eval/humaneval";
  int threads = 0;
  bool json = false;
  // compile-pass and context
  std::string files;
  size_t max_files = 0;
  eval::BodyCutOptions cuts;
  bool original = false;  // context: score the original bodies
};

eval::Isolation choose_isolation(const std::string& mode) {
  if (mode == "none") return eval::Isolation::kNone;
  if (mode != "auto" && mode != "namespaces")
    throw Error("--sandbox must be auto, namespaces or none (got " + mode + ")");
  const std::string why = eval::Sandbox::probe();
  if (why.empty()) return eval::Isolation::kNamespaces;
  if (mode == "namespaces") throw Error("--sandbox namespaces: not available here: " + why);
  std::cerr << "slm: warning: the sandbox cannot use namespaces here (" << why
            << "); programs run with limits and a process group only: NO network isolation, the file system is "
               "writable wherever this user may write (docs/evaluation.md, \"Sandbox\")\n";
  return eval::Isolation::kNone;
}

// Where the completions come from: a file of ready ones, a server (--model URL) or the in-process model.
std::unique_ptr<eval::CompletionSource> make_source(HumanEvalCli& c, const std::vector<eval::Problem>& problems) {
  if (!c.completions.empty()) {
    if (!c.model.checkpoint.empty()) throw Error("give either --completions or --model, not both");
    return std::make_unique<eval::CompletionsFile>(c.completions, problems);
  }
  auto& sampling = c.model.sampling;
  sampling.temperature = c.temperature >= 0 ? c.temperature : (c.run.n == 1 ? 0.0 : 0.8);
  if (eval::is_server_url(c.model.checkpoint)) {
    if (!c.model.recipe.empty() || !c.model.tokenizer.empty())
      throw Error("--recipe and --tokenizer are the server's business when --model is a URL");
    c.server.url = c.model.checkpoint;
    c.server.sampling = sampling;
    return std::make_unique<eval::ServerCompletions>(c.server);
  }
  if (c.threads > 0) torch::set_num_threads(c.threads);
  if (c.model.checkpoint.empty())
    std::cerr << "slm: warning: no checkpoint (--model): the weights are RANDOM, so every completion is noise\n";
  return std::make_unique<eval::ModelCompletions>(c.model);
}

// --tasks, then --limit: the items whose problem is named, then the first N.
template <class T, class Problem>
std::vector<T> select_tasks(const HumanEvalCli& c, std::vector<T> items, const std::string& label, Problem problem) {
  if (!c.tasks.empty()) {
    std::set<std::string> want(c.tasks.begin(), c.tasks.end());
    std::vector<T> chosen;
    for (auto& item : items)
      if (want.erase(problem(item).name)) chosen.push_back(std::move(item));
    if (!want.empty()) throw Error("--tasks: " + *want.begin() + " is not in " + label);
    items = std::move(chosen);
  }
  if (c.limit > 0 && static_cast<size_t>(c.limit) < items.size()) items.resize(static_cast<size_t>(c.limit));
  return items;
}

// Generates (or reads) completions for the problems, judges them and reports; label names the problem set.
void run_problems(HumanEvalCli& c, std::vector<eval::Problem> problems, const std::string& label) {
  problems =
      select_tasks(c, std::move(problems), label, [](const eval::Problem& p) -> const eval::Problem& { return p; });

  auto& o = c.run;
  if (!c.out.empty()) {
    make_dirs(c.out);
    o.results_path = c.out + "/results.jsonl";
  }

  if (c.completions.empty() && !c.out.empty()) o.completions_path = c.out + "/completions.jsonl";
  auto source = make_source(c, problems);
  std::cerr << "slm: " << problems.size() << " problems from " << label << "; completions: " << source->describe()
            << "\n";
  auto report = [&] {
    ProgressBar bar(std::cerr, o.compile.syntax_only ? "compile-pass" : "humaneval", 0, "samples");
    auto r = eval::run_humaneval(label, problems, *source, o, bar.callback());
    bar.finish();
    return r;
  }();
  if (!c.out.empty())
    write_file_atomic(c.out + "/summary.json",
                      report.summary_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (c.json)
    std::cout << report.summary_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else
    std::cout << report.table();
  if (!c.out.empty())
    std::cerr << "slm: wrote " << c.out << "/results.jsonl (every sample's outcome), " << c.out << "/summary.json"
              << (o.completions_path.empty() ? "" : ", " + o.completions_path + " (rescore with --completions)")
              << "\n";
}

// The sandbox settings the options describe.
void apply_limits(HumanEvalCli& c) {
  auto& o = c.run;
  o.isolation = choose_isolation(c.sandbox);
  o.run.memory_bytes = static_cast<uint64_t>(c.memory_mb * (1 << 20));
  o.run.output_bytes = static_cast<size_t>(c.max_output_kb * 1024);
  o.run.cpu_s = std::max(1, static_cast<int>(std::ceil(o.run.wall_s)));
}

// The judge (and the context command's preprocessor) run in directories of their own.
void absolute_include_dirs(HumanEvalCli& c) {
  for (auto& d : c.run.compile.include_dirs) {
    char* real = ::realpath(d.c_str(), nullptr);
    if (!real) throw Error("--include " + d + ": " + std::strerror(errno));
    d = real;
    std::free(real);
  }
}

void run_compile_pass_cli(HumanEvalCli& c) {
  c.run.compile.syntax_only = true;
  absolute_include_dirs(c);
  apply_limits(c);
  auto cuts = eval::cut_source_tree(c.files, c.max_files, c.cuts);
  const size_t all = cuts.size();
  {
    eval::Judge judge(c.run.compile, c.run.run, c.run.isolation);
    ProgressBar bar(std::cerr, "control", all, "cuts");
    cuts = eval::keep_compiling(std::move(cuts), judge, c.run.jobs, [&](size_t done, size_t) { bar.update(done); });
    bar.finish();
  }
  std::cerr << "slm: " << all << " function bodies cut from " << c.files << "; " << cuts.size()
            << " compile with their original body (the rest are left out: their file does not compile here)\n";
  if (cuts.empty()) throw Error("compile-pass: no cut compiles with its original body under " + c.files);
  std::vector<eval::Problem> problems;
  for (auto& cut : cuts) problems.push_back(std::move(cut.problem));
  run_problems(c, std::move(problems), c.files);
}

void run_context_cli(HumanEvalCli& c) {
  absolute_include_dirs(c);
  eval::ContextCaseOptions co;
  co.cut = c.cuts;
  co.max_prompt_bytes = c.model.sampling.max_prompt_bytes;  // so the whole prompt is within it
  auto cases = select_tasks(c, eval::make_context_cases(c.files, co), c.files,
                            [](const eval::ContextCase& k) -> const eval::Problem& { return k.problem; });
  if (cases.empty())
    throw Error("context adherence: no function under " + c.files +
                " calls another function of the tree and has a body to cut (or none of its callees fits "
                "--max-context-bytes)");
  std::vector<eval::Problem> problems;
  for (const auto& k : cases) problems.push_back(k.problem);
  if (!c.out.empty()) make_dirs(c.out);
  std::unique_ptr<eval::CompletionSource> source;
  if (c.original) {  // the metric on the code as written: its floor for hallucination, its ceiling for adherence
    if (!c.completions.empty() || !c.model.checkpoint.empty())
      throw Error("--original scores the original bodies: give no --model or --completions");
    c.completions = (c.out.empty() ? std::string("/tmp") : c.out) + "/original-bodies.jsonl";
    std::string lines;
    for (const auto& k : cases)
      lines += nlohmann::json{{"task_id", k.problem.name}, {"completion", k.body}}.dump(
                   -1, ' ', false, nlohmann::json::error_handler_t::replace) +
               "\n";
    write_file_atomic(c.completions, lines);
  }
  source = make_source(c, problems);
  std::cerr << "slm: " << cases.size() << " context-graph cases from " << c.files
            << "; completions: " << source->describe() << "\n";
  eval::KnownIdentifiers known(c.run.compile.compiler, c.run.compile.standard, c.run.compile.include_dirs);
  ProgressBar bar(std::cerr, "context", cases.size(), "cases");
  const auto r = eval::run_context_adherence(cases, *source, c.run.n, known, c.files,
                                             c.out.empty() ? "" : c.out + "/results.jsonl",
                                             [&](size_t done, size_t) { bar.update(done); });
  bar.finish();
  auto j = r.json();
  j["files"] = c.files;
  j["source"] = source->describe();
  if (!c.out.empty())
    write_file_atomic(c.out + "/summary.json", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (c.json) {
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Context adherence (%s): %zu cases, %zu completions\ncompletions: %s\n\n"
                "calls a provided callee              %6.2f%%   (%zu of %zu completions)\n"
                "unknown identifiers (hallucinated)   %6.2f%%   (%llu of %llu identifiers used)\n"
                "completions with an unknown one      %6.2f%%   (%zu)\n",
                c.files.c_str(), r.cases, r.completions, source->describe().c_str(), 100 * r.adherence(), r.adhering,
                r.completions, 100 * r.hallucination_rate(), static_cast<unsigned long long>(r.unknown),
                static_cast<unsigned long long>(r.identifiers),
                r.completions ? 100.0 * static_cast<double>(r.with_unknown) / static_cast<double>(r.completions) : 0.0,
                r.with_unknown);
  std::cout << buf;
  if (!r.specialists.empty()) {
    std::cout << "answered by:";
    for (const auto& [name, count] : r.specialists) std::cout << " " << name << " " << count;
    std::cout << "\n";
  }
  if (!c.out.empty()) std::cerr << "slm: wrote " << c.out << "/results.jsonl and " << c.out << "/summary.json\n";
}

// The options of every command here: where completions come from, sampling, the selection, the output.
void add_source_options(CLI::App* h, const std::shared_ptr<HumanEvalCli>& c);
// Those of the commands that compile what the model wrote: pass@k and the judge's limits.
void add_judge_options(CLI::App* h, const std::shared_ptr<HumanEvalCli>& c);
// The held-out source tree of compile-pass and context, and which function bodies are cut from it.
void add_tree_options(CLI::App* h, const std::shared_ptr<HumanEvalCli>& c, const std::string& per_file_flag,
                      const std::string& per_file_what) {
  h->add_option("--files", c->files, "directory of held-out C++ code, searched recursively")->required();
  h->add_option(per_file_flag, c->cuts.max_per_file, per_file_what)->capture_default_str();
  h->add_option("--min-body-lines", c->cuts.min_body_lines, "shorter bodies are not cut")->capture_default_str();
  h->add_option("--max-body-bytes", c->cuts.max_body_bytes, "longer bodies are not cut")->capture_default_str();
  h->add_option("--include,-I", c->run.compile.include_dirs,
                "include directory of the held-out project (repeatable; each file's own directory is always searched "
                "for #include \"...\")");
}

// The compiler and the standard (the judge's, and the preprocessor that lists a file's known identifiers).
void add_compiler_options(CLI::App* h, const std::shared_ptr<HumanEvalCli>& c) {
  h->add_option("--compiler", c->run.compile.compiler, "C++ compiler")->capture_default_str();
  h->add_option("--std", c->run.compile.standard, "language standard")->capture_default_str();
}

}  // namespace

void add_eval_humaneval_command(CLI::App* eval) {
  auto c = std::make_shared<HumanEvalCli>();
  auto* h = eval->add_subcommand(
      "humaneval",
      "Functional correctness: complete each problem (MultiPL-E HumanEval-C++ or a file of the same format), compile "
      "it with the tests, run it in a sandbox, report pass@k (docs/evaluation.md)");
  h->add_option("--problems", c->problems, "problem file (MultiPL-E JSONL: name, prompt, tests, stop_tokens)")
      ->capture_default_str();
  add_source_options(h, c);
  add_judge_options(h, c);
  add_compiler_options(h, c);
  h->callback([c] {
    apply_limits(*c);
    run_problems(*c, eval::load_problems(c->problems), c->problems);
  });

  auto p = std::make_shared<HumanEvalCli>();
  p->out = "out/eval/compile-pass";
  p->run.compile.pch = false;  // the files' include blocks differ
  p->run.compile.standard = "c++20";
  p->model.sampling.max_prompt_bytes = 2000;  // a file's prefix can be longer than the models' context
  auto* cp = eval->add_subcommand(
      "compile-pass",
      "Compile-pass on held-out code: cut C++ files at function bodies, complete each body, report the share with "
      "which the file still compiles (g++ -fsyntax-only; docs/evaluation.md)");
  add_tree_options(cp, p, "--cuts-per-file", "function bodies cut per file");
  cp->add_option("--max-files", p->max_files, "only the first N files, sorted by path (0: all)")->capture_default_str();
  add_source_options(cp, p);
  add_judge_options(cp, p);
  add_compiler_options(cp, p);
  cp->callback([p] { run_compile_pass_cli(*p); });

  auto x = std::make_shared<HumanEvalCli>();
  x->out = "out/eval/context";
  x->run.compile.standard = "c++20";
  // Cases are built to fit: the #include lines, whole callee and caller definitions (callees first), the head.
  x->model.sampling.max_prompt_bytes = eval::ContextCaseOptions{}.max_prompt_bytes;
  auto* cx = eval->add_subcommand(
      "context",
      "Context adherence and hallucination on held-out code: give the model a function's callees and callers and its "
      "signature, let it write the body, report the share that calls a provided callee and the rate of identifiers "
      "found neither in the prompt, the file, its includes nor the standard library (docs/evaluation.md)");
  add_tree_options(cx, x, "--cases-per-file", "target functions per file");
  cx->add_flag("--original", x->original,
               "score the original bodies instead of a model's (the measures on code as written)");
  add_source_options(cx, x);
  add_compiler_options(cx, x);
  cx->callback([x] { run_context_cli(*x); });
}

namespace {

void add_source_options(CLI::App* h, const std::shared_ptr<HumanEvalCli>& c) {
  h->add_option("--model,--checkpoint", c->model.checkpoint,
                "training checkpoint, run directory (its latest) or weights file to generate with; or the URL of a "
                "running `slm serve` (http://HOST:PORT) to ask over its HTTP API");
  h->add_option("--server-model", c->server.model,
                "with a server URL: the model each request names (a specialist, or auto: the router picks)")
      ->capture_default_str();
  h->add_option("--parallel", c->server.parallel,
                "with a server URL: requests in flight at once (the server batches them)")
      ->capture_default_str();
  h->add_option("--api-key", c->server.api_key, "with a server URL: its API key, if it wants one");
  h->add_option("--recipe", c->model.recipe,
                "recipe (default: the training checkpoint's; alone, without --model: RANDOM weights)");
  h->add_option("--tokenizer", c->model.tokenizer,
                "tokenizer .model or 'byte' (default: the one the checkpoint was trained with, else byte-level)");
  h->add_option("--completions", c->completions,
                "score ready completions instead of generating: JSONL of {\"task_id\", \"completion\"}");
  h->add_option("--n", c->run.n, "samples per problem (greedy pass@1: 1; pass@10: 20 or more)")->capture_default_str();
  h->add_option("--temperature", c->temperature, "sampling temperature (default: 0 = greedy for --n 1, else 0.8)");
  h->add_option("--top-p", c->model.sampling.top_p, "nucleus sampling mass")->capture_default_str();
  h->add_option("--top-k", c->model.sampling.top_k, "sample from the k most likely tokens (0 = all; not with a URL)")
      ->capture_default_str();
  h->add_option("--seed", c->model.sampling.seed, "sampling seed (and of RANDOM weights)")->capture_default_str();
  h->add_option("--max-prompt-bytes", c->model.sampling.max_prompt_bytes,
                "the model sees each prompt's last lines within this many bytes (0: all; the program judged keeps "
                "all of it)")
      ->capture_default_str();
  h->add_option("--max-tokens", c->model.sampling.max_tokens,
                "tokens per completion (generation also stops at the stop "
                "sequences and at EOS)")
      ->capture_default_str();
  h->add_option("--device", c->model.device, "cpu or cuda")->capture_default_str();
  h->add_option("--slots", c->model.slots,
                "in-process: sequences generated at once (continuous batching; the samples of a problem and of the "
                "next ones)")
      ->capture_default_str();
  h->add_option("--threads", c->threads, "CPU threads for generation (0: torch's default)")->capture_default_str();
  h->add_option("--tasks", c->tasks, "only these problems (names, comma-separated)")->delimiter(',');
  h->add_option("--limit", c->limit, "only the first N problems (0: all)")->capture_default_str();
  h->add_option("--out", c->out, "directory for results.jsonl, completions.jsonl and summary.json (\"\": write none)")
      ->capture_default_str();
  h->add_flag("--json", c->json, "print the summary as JSON");
}

void add_judge_options(CLI::App* h, const std::shared_ptr<HumanEvalCli>& c) {
  h->add_option("--k", c->run.ks, "pass@k to report (those <= n)")->delimiter(',')->capture_default_str();
  h->add_option("--jobs", c->run.jobs, "programs compiled and run in parallel (0: one per core)")
      ->capture_default_str();
  h->add_option("--timeout", c->run.run.wall_s, "wall-clock seconds per test program (CPU time: the same)")
      ->capture_default_str();
  h->add_option("--memory-mb", c->memory_mb, "address-space limit of a test program")->capture_default_str();
  h->add_option("--max-output-kb", c->max_output_kb, "stdout/stderr a test program may write (each)")
      ->capture_default_str();
  h->add_option("--max-procs", c->run.run.processes, "processes a test program may have")->capture_default_str();
  h->add_option("--sandbox", c->sandbox,
                "auto (namespaces when permitted, else none with a warning), namespaces, or none")
      ->capture_default_str();
  h->add_flag(
      "--no-pch", [c](int64_t) { c->run.compile.pch = false; },
      "compile each program from scratch, without the precompiled #include block");
}

}  // namespace

}  // namespace slm::cli
