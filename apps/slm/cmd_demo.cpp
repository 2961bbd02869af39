// slm demo: the first main job. On a fresh machine: a small C++ corpus from the installed headers, token shards,
// a few minutes of CPU training of the tiny hybrid recipe with live progress, the loss curve, and a completion.
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/data/corpus.h"
#include "slm/data/shard_builder.h"
#include "slm/data/tokenizer.h"
#include "slm/engine/generation.h"
#include "slm/io/run_dir.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/weights.h"
#include "slm/text/text_generation.h"
#include "slm/train/plot.h"
#include "slm/train/trainer.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/progress.h"

namespace slm::cli {

namespace {

struct DemoOptions {
  std::string out = "out/demo";
  std::string recipe = "recipes/tiny-hybrid.json";
  std::string tokenizer = "tokenizer/slm-code-512.model";
  std::string eval = "../shared/eval/multipl-e/humaneval-cpp.jsonl";
  double corpus_mb = 6;
  int64_t steps = 800;
  int64_t batch = 8;
  int64_t seq_len = 128;
  std::string prompt = "#include <vector>\n\nnamespace util {\n\ntemplate <typename T>\n";
  int64_t max_tokens = 120;
  int threads = 0;
};

bool exists(const std::string& p) {
  return ::access(p.c_str(), F_OK) == 0;
}

std::atomic<bool> g_demo_stop{false};
extern "C" void on_demo_signal(int sig) {
  g_demo_stop = true;
  std::signal(sig, SIG_DFL);
}

void run_demo(const DemoOptions& o) {
  if (o.threads > 0) torch::set_num_threads(o.threads);
  for (const auto& f : {o.recipe, o.tokenizer})
    if (!exists(f)) throw Error(f + ": not found (run slm demo from the repository root)");
  // The demo owns its directory: a previous demo run is replaced, anything else is refused.
  const std::string marker = o.out + "/.slm-demo";
  if (exists(o.out)) {
    if (!exists(marker)) throw Error(o.out + " exists and is not a demo directory; choose another --out");
    remove_tree(o.out);
  }
  make_dirs(o.out);
  write_file_atomic(marker, "slm demo output; `slm demo` replaces this directory\n");

  std::cerr << "== 1/5 corpus: C++ headers installed on this machine (up to " << o.corpus_mb << " MB)\n";
  data::CorpusOptions co;
  co.domains = {"cpp"};
  co.out_dir = o.out + "/corpus";
  co.roots["cpp"] = data::default_roots("cpp");
  co.max_bytes_per_domain = static_cast<uint64_t>(o.corpus_mb * 1e6);
  co.validation_fraction = 0.02;
  co.test_fraction = 0.02;
  if (exists(o.eval))
    co.eval_jsonl = o.eval;
  else
    std::cerr << "note: " << o.eval << " not found: the demo corpus is not decontaminated against it\n";
  std::unique_ptr<ProgressBar> bar;
  std::string phase;
  auto report = data::build_corpus(co, [&](const std::string& ph, uint64_t done, uint64_t total) {
    if (ph != phase) {
      if (bar) bar->finish();
      phase = ph;
      bar = std::make_unique<ProgressBar>(std::cerr, "  " + ph, total, ph == "read" ? "B" : "files");
    }
    bar->set_total(total);
    bar->update(done);
  });
  if (bar) bar->finish();
  std::cerr << report.table();

  std::cerr << "== 2/5 token shards (" << o.tokenizer << ")\n";
  data::ShardBuildOptions so;
  so.inputs = {co.out_dir};
  so.tokenizer = o.tokenizer;
  so.out_dir = o.out + "/shards";
  {
    ProgressBar sb(std::cerr, "  tokenize", 0, "B");
    for (const auto& g : data::build_shards(so, sb.callback()))
      std::cerr << "\n  " << g.name << ": " << g.documents << " documents, " << g.tokens << " tokens";
    sb.finish();
  }
  std::cerr << "\n";

  std::cerr << "== 3/5 training " << o.recipe << " on the CPU (Ctrl-C stops and keeps a checkpoint)\n";
  train::TrainConfig tc;
  tc.recipe = o.recipe;
  tc.data = so.out_dir;
  tc.out = o.out + "/run";
  tc.tokenizer = o.tokenizer;
  tc.steps = o.steps;
  tc.batch = o.batch;
  tc.seq_len = o.seq_len;
  tc.lr.warmup_steps = std::min<int64_t>(20, o.steps / 10);
  tc.eval_every = std::max<int64_t>(1, o.steps / 8);
  tc.checkpoint_every = std::max<int64_t>(1, o.steps / 4);
  tc.keep_last = 2;
  std::signal(SIGINT, on_demo_signal);
  std::signal(SIGTERM, on_demo_signal);
  train::Trainer trainer(tc, std::cerr);
  trainer.run(&g_demo_stop);

  std::cerr << "== 4/5 loss curves\n";
  for (const auto& png : train::plot_run(tc.out)) std::cout << "picture: " << png << "\n";

  std::cerr << "== 5/5 a completion from the trained checkpoint\n";
  auto tok = data::Tokenizer::load(o.tokenizer);
  auto recipe = load_recipe(o.recipe);
  model::HybridLM m(recipe);
  model::load_weights(m, model::weights_path(io::latest_checkpoint(tc.out)));
  m.eval();
  engine::GenerationOptions go;
  go.max_tokens = o.max_tokens;
  go.sampling = {0.7, 40, 0.95, 1};
  std::cout << "----- prompt -----\n" << o.prompt << "----- completion -----\n";
  text::generate_text(m, tok, o.prompt, go, [](const std::string& text) { std::cout << text << std::flush; });
  std::cout << "\n----- end -----\n";
  std::cerr << "checkpoint: " << tc.out << " (slm train --resume " << tc.out << " --steps N continues it)\n";
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  auto* d = app.add_subcommand(
      "demo",
      "The first main job: build a small C++ corpus from installed headers, train the tiny hybrid recipe on "
      "the CPU for a few minutes, plot the loss and complete a C++ prompt");
  d->add_option("--out", o->out, "demo directory (replaced on each run)")->capture_default_str();
  d->add_option("--recipe", o->recipe, "recipe to train")->capture_default_str();
  d->add_option("--tokenizer", o->tokenizer, "tokenizer whose vocabulary fits the recipe")->capture_default_str();
  d->add_option("--corpus-mb", o->corpus_mb, "corpus size cap")->capture_default_str();
  d->add_option("--steps", o->steps, "training steps")->capture_default_str();
  d->add_option("--batch", o->batch, "sequences per step")->capture_default_str();
  d->add_option("--seq-len", o->seq_len, "tokens per sequence")->capture_default_str();
  d->add_option("--prompt", o->prompt, "the C++ prompt to complete")->capture_default_str();
  d->add_option("--max-tokens", o->max_tokens, "tokens to generate")->capture_default_str();
  d->add_option("--threads", o->threads, "CPU threads (0: torch's default)")->capture_default_str();
  d->callback([o] { run_demo(*o); });
}

}  // namespace slm::cli
