// slm eval fim: code completion at a cursor on held-out files (src/slm/eval/fim_eval.h): single-line and
// function-body cases, prompted through the infill prompt in three context modes, against the copy-line-above
// baseline and a random-weight model of the same recipe; Markdown, JSON and a PNG.
#include <torch/torch.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/eval/context_adherence.h"
#include "slm/eval/fim_eval.h"
#include "slm/eval/sandbox.h"
#include "slm/io/run_dir.h"
#include "slm/model/weights.h"
#include "slm/recipe/ensemble.h"
#include "slm/recipe/recipe.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/progress.h"

namespace slm::cli {

namespace {

struct FimCli {
  std::string corpus, domain = "cpp", split = "test";
  eval::FimCaseOptions cases;
  std::string contexts = "none,neighbours,graph";
  eval::FimRunOptions run;
  std::string model, recipe, tokenizer, name = "model";
  std::string ensemble;
  std::vector<std::string> specialists;
  bool no_random = false, no_compile = false;
  std::string device = "cpu";
  int threads = 0;
  eval::CompileOptions compile;
  eval::FimLatencyOptions latency;  // latency.url "": not measured
  std::string out = "out/eval/fim";
  bool json = false;
};

// A model of the recipe with the checkpoint's weights ("": random weights from seed), on the device.
eval::FimModel load_model(const std::string& name, const std::string& recipe_path, const std::string& checkpoint,
                          const std::string& tokenizer, const std::string& device, uint64_t seed) {
  if (tokenizer.empty() || tokenizer == "byte")
    throw Error(name + ": fill-in-the-middle needs the code tokenizer with its FIM tokens (--tokenizer)");
  eval::FimModel m;
  m.name = name;
  m.tokenizer = std::make_shared<data::Tokenizer>(data::Tokenizer::load(tokenizer));
  text::infill_tokens(*m.tokenizer);  // throws for a tokenizer without the FIM specials
  const Recipe recipe = load_recipe(recipe_path);
  torch::manual_seed(seed);
  m.model = std::make_shared<model::HybridLM>(recipe);  // on the CPU, so a seed gives the same weights everywhere
  m.model->eval();
  // Before the weights load: NVFP4 matrices are placed on the device of the weight they replace as they load.
  m.model->to(parse_device(device));
  std::string weights = "RANDOM weights, seed " + std::to_string(seed);
  if (!checkpoint.empty()) {
    weights = model::weights_path(io::resolve_run_dir(checkpoint));
    model::load_weights(*m.model, weights);
  }
  m.description = "recipe " + recipe.name + " (" + recipe_path + "), " + weights + ", tokenizer " + tokenizer;
  return m;
}

void run_fim_cli(FimCli& c) {
  if (c.threads > 0) torch::set_num_threads(c.threads);
  c.run.contexts = eval::parse_fim_contexts(c.contexts);
  std::vector<eval::FimModel> models;
  std::string recipe = c.recipe, tokenizer = c.tokenizer;  // of the random baseline: the first model's
  if (!c.ensemble.empty()) {
    if (c.specialists.empty()) throw Error("--ensemble: name the specialists to evaluate (--specialist cpp,...)");
    const Ensemble e = load_ensemble(c.ensemble);
    for (const auto& want : c.specialists) {
      const auto it =
          std::find_if(e.specialists.begin(), e.specialists.end(), [&](const Specialist& s) { return s.name == want; });
      if (it == e.specialists.end()) throw Error(c.ensemble + ": no specialist '" + want + "'");
      if (it->checkpoint.empty()) throw Error(c.ensemble + ": specialist '" + want + "' has no checkpoint");
      models.push_back(load_model(it->name, it->recipe_path, it->checkpoint, it->tokenizer, c.device, c.cases.seed));
      if (recipe.empty()) recipe = it->recipe_path;
      if (tokenizer.empty()) tokenizer = it->tokenizer;
    }
  } else if (!c.specialists.empty()) {
    throw Error("--specialist needs --ensemble");
  }
  if (!c.model.empty()) {
    if (c.recipe.empty()) throw Error("--model needs the recipe it was trained from (--recipe)");
    models.insert(models.begin(), load_model(c.name, c.recipe, c.model, c.tokenizer, c.device, c.cases.seed));
  }
  if (!c.no_random) {
    if (recipe.empty()) throw Error("the random-weight baseline needs a recipe: give --model, --ensemble or --recipe");
    models.push_back(load_model("random", recipe, "", tokenizer, c.device, c.cases.seed));
  }

  const auto files = eval::read_held_out(c.corpus, c.domain, c.split);
  if (files.empty()) throw Error(c.corpus + "/" + c.domain + "/" + c.split + ".jsonl: no C++ file");
  auto cases = eval::make_fim_cases(files, c.cases);
  size_t candidates = 0;
  for (const auto& k : cases) candidates += k.kind == eval::FimKind::kBody;
  std::unique_ptr<eval::Judge> judge;
  if (!c.no_compile && candidates > 0) {
    c.compile.syntax_only = true;
    c.compile.pch = false;  // the files' include blocks differ
    // Only the compiler runs (-fsyntax-only): namespaces where the machine permits them, else limits alone.
    const auto isolation = eval::Sandbox::probe().empty() ? eval::Isolation::kNamespaces : eval::Isolation::kNone;
    judge = std::make_unique<eval::Judge>(c.compile, eval::SandboxLimits{}, isolation);
    ProgressBar bar(std::cerr, "control", candidates, "bodies");
    cases = eval::keep_compiling_bodies(std::move(cases), *judge, c.run.jobs,
                                        [&](size_t done, size_t) { bar.update(done); });
    bar.finish();
    c.run.judge = judge.get();
  }
  if (cases.empty()) throw Error("no case: the held-out files have no code line or function body to complete");
  // An identifier of the standard library is no invention (the compiler's <bits/stdc++.h>, preprocessed once).
  eval::KnownIdentifiers known(c.compile.compiler, c.compile.standard, {});
  c.run.standard_identifiers = &known.standard_library();
  if (!c.out.empty()) {
    make_dirs(c.out);
    c.run.results_path = c.out + "/predictions.jsonl";
  }
  std::cerr << "slm: " << files.size() << " held-out files of " << c.corpus << "/" << c.domain << "/" << c.split
            << ".jsonl, " << cases.size() << " cases, " << models.size() << " models\n";
  eval::FimReport report = [&] {
    ProgressBar bar(std::cerr, "fim", 0, "predictions");
    auto r = eval::run_fim(files, cases, models, c.run, [&](size_t done, size_t total) {
      bar.set_total(total);
      bar.update(done);
    });
    bar.finish();
    return r;
  }();
  report.corpus = c.corpus;
  report.domain = c.domain;
  report.split = c.split;
  report.body_candidates = candidates;
  std::string md = report.markdown();
  auto j = report.json();
  if (!c.latency.url.empty()) {
    ProgressBar bar(std::cerr, "/infill", 0, "requests");
    const auto latency = eval::measure_fim_latency(cases, c.latency, [&](size_t done, size_t total) {
      bar.set_total(total);
      bar.update(done);
    });
    bar.finish();
    md += latency.markdown();
    j["latency"] = latency.json();
  }
  if (!c.out.empty()) {
    write_file_atomic(c.out + "/fim.md", md);
    write_file_atomic(c.out + "/fim.json", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    const std::string png = eval::plot_fim(report, c.out);
    std::cerr << "slm: wrote " << c.out << "/fim.md, fim.json, " << png << " and predictions.jsonl\n";
  }
  std::cout << (c.json ? j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n" : md);
}

}  // namespace

void add_eval_fim_command(CLI::App* eval) {
  auto c = std::make_shared<FimCli>();
  auto* f = eval->add_subcommand(
      "fim",
      "Code completion at a cursor on held-out files of a corpus: single-line cases (the rest of a line after its "
      "indentation) and function-body cases, prompted as an editor's /infill request (SPM) with no extra context, "
      "llama.vim-style neighbour chunks or the call graph's callers and callees; exact match of the first line, edit "
      "similarity, and the share of bodies with which the file compiles; baselines: copy the line above, random "
      "weights of the same recipe (docs/evaluation.md)");
  f->add_option("--corpus", c->corpus, "corpus directory (slm data build --out): reads DOMAIN/SPLIT.jsonl")->required();
  f->add_option("--domain", c->domain, "the corpus domain whose C++ files are the cases")->capture_default_str();
  f->add_option("--split", c->split, "held-out split: test or validation")->capture_default_str();
  f->add_option("--cases", c->cases.line_cases, "single-line cases at most (0: none)")->capture_default_str();
  f->add_option("--body-cases", c->cases.body_cases,
                "function-body cases at most, before the compile control drops bodies whose file does not compile "
                "here as written (0: none)")
      ->capture_default_str();
  f->add_option("--lines-per-file", c->cases.lines_per_file, "single-line cases per file before the cap")
      ->capture_default_str();
  f->add_option("--bodies-per-file", c->cases.cut.max_per_file, "function-body cases per file before the cap")
      ->capture_default_str();
  f->add_option("--min-line-chars", c->cases.min_line_chars,
                "a line case needs at least this many characters after the indentation")
      ->capture_default_str();
  f->add_option("--min-body-lines", c->cases.cut.min_body_lines, "shorter bodies are no case")->capture_default_str();
  f->add_option("--max-body-bytes", c->cases.cut.max_body_bytes, "longer bodies are no case")->capture_default_str();
  f->add_option("--seed", c->cases.seed, "picks the cases, and seeds the random-weight baseline")
      ->capture_default_str();
  f->add_option("--context", c->contexts,
                "context modes, comma-separated: none (the file alone), neighbours (the first --chunk-lines lines of "
                "up to --max-chunks other held-out files of the same package, by path), graph (the definitions of "
                "the callers and callees of the function around the cursor, from the package's call graph)")
      ->capture_default_str();
  f->add_option("--chunk-lines", c->run.context.chunk_lines, "lines per neighbour chunk (llama.vim's ring_chunk_size)")
      ->capture_default_str();
  f->add_option("--max-chunks", c->run.context.max_chunks,
                "extra chunks per prompt at most (llama.vim's ring_n_chunks)")
      ->capture_default_str();
  f->add_option("--line-tokens", c->run.generate.line_tokens,
                "tokens generated at most for a single-line case (it also stops at the first newline and at EOS)")
      ->capture_default_str();
  f->add_option("--body-tokens", c->run.generate.body_tokens,
                "tokens generated at most for a body case (it also stops at the body's closing brace and at EOS)")
      ->capture_default_str();
  f->add_option("--ctx-size", c->run.generate.context,
                "tokens of prompt and generation together (0: the recipe's seq_len); the prompt gets this less the "
                "generation cap")
      ->capture_default_str();
  f->add_option("--model", c->model, "a checkpoint to evaluate: training checkpoint, run directory or weights file");
  f->add_option("--recipe", c->recipe,
                "the recipe of --model; alone, the recipe of the random-weight baseline (default: the first model's)");
  f->add_option("--tokenizer", c->tokenizer,
                "code tokenizer .model of --model and the random baseline (default: the first specialist's)");
  f->add_option("--name", c->name, "the name of --model in the report")->capture_default_str();
  f->add_option("--ensemble", c->ensemble, "ensemble manifest (e.g. models/ensemble.json) to take specialists from");
  f->add_option("--specialist", c->specialists, "the ensemble's specialists to evaluate, comma-separated")
      ->delimiter(',');
  f->add_flag("--no-random", c->no_random, "leave out the random-weight baseline");
  f->add_flag("--no-compile", c->no_compile, "do not compile the body predictions (no control either)");
  f->add_option("--jobs", c->run.jobs, "compilations in parallel")->capture_default_str();
  f->add_option("--compiler", c->compile.compiler, "C++ compiler")->capture_default_str();
  c->compile.standard = "c++20";
  f->add_option("--std", c->compile.standard, "language standard")->capture_default_str();
  f->add_option("--include,-I", c->compile.include_dirs,
                "include directory for the compile check (repeatable; each file's own directory is always searched "
                "for #include \"...\")");
  f->add_option("--device", c->device, "cpu or cuda")->capture_default_str();
  f->add_option("--threads", c->threads, "CPU threads (0: torch's default)")->capture_default_str();
  f->add_option("--server", c->latency.url,
                "also measure POST /infill of a running `slm serve` (http://HOST:PORT) as llama.vim sends it: per "
                "held-out file (up to --latency-files) its first single-line case cold, then --warm requests with "
                "the cursor moved on by --step-chars typed characters each; p50/p95 wall time, mean tokens_cached "
                "and timings.prompt_n");
  f->add_option("--server-model", c->latency.model, "the /infill requests' \"model\" (\"\": the server's choice)");
  f->add_option("--api-key", c->latency.api_key, "the server's API key, if it wants one");
  f->add_option("--prefix-chars", c->latency.window.prefix_chars,
                "the /infill requests' input_prefix: the whole lines before the cursor's line within this many "
                "characters")
      ->capture_default_str();
  f->add_option("--suffix-lines", c->latency.window.suffix_lines,
                "the /infill requests' input_suffix: lines after the cursor (llama.vim's n_suffix)")
      ->capture_default_str();
  f->add_option("--window-prefix-chars", c->run.window.prefix_chars,
                "the quality cases' prefix as an editor sends it: the whole lines before the cursor's line within "
                "this many characters (0: the whole file); the graph context is found from the same window")
      ->capture_default_str();
  f->add_option("--window-suffix-lines", c->run.window.suffix_lines,
                "the quality cases' suffix: this many lines after the cursor's (0: the rest of the file)")
      ->capture_default_str();
  f->add_option("--n-predict", c->latency.n_predict, "n_predict of the /infill requests")->capture_default_str();
  f->add_option("--warm", c->latency.warm, "warm requests per file after the cold one")->capture_default_str();
  f->add_option("--step-chars", c->latency.step_chars, "characters typed between two requests of a file")
      ->capture_default_str();
  f->add_option("--latency-files", c->latency.max_files, "files (cold requests) at most")->capture_default_str();
  f->add_option("--out", c->out, "directory for fim.md, fim.json, fim.png and predictions.jsonl (\"\": none)")
      ->capture_default_str();
  f->add_flag("--json", c->json, "print the JSON report instead of the Markdown one");
  f->callback([c] { run_fim_cli(*c); });
}

}  // namespace slm::cli
