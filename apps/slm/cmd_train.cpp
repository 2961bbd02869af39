// slm train | plot
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/data/pack.h"
#include "slm/train/launch.h"
#include "slm/train/plot.h"
#include "slm/train/trainer.h"
#include "slm/util/error.h"

namespace slm::cli {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
  g_stop = true;
  // A second signal kills the process the usual way.
  std::signal(sig, SIG_DFL);
}

struct TrainCli {
  train::TrainConfig cfg;
  std::string resume;
  std::vector<std::string> optim_overrides;  // key=value into the optimizer configuration
  std::vector<std::string> mix;              // domain=weight
  std::string schedule = "wsd";
  int threads = 0;
  int nproc = 1;
};

// "key=value" with value parsed as JSON when it is JSON (numbers, true/false), else taken as a string.
std::pair<std::string, nlohmann::json> key_value(const std::string& kv, const std::string& flag) {
  auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) throw Error(flag + " " + kv + ": expected key=value");
  auto value = nlohmann::json::parse(kv.substr(eq + 1), nullptr, false);
  if (value.is_discarded()) value = kv.substr(eq + 1);
  return {kv.substr(0, eq), value};
}

void run_train(TrainCli& o, CLI::App* sub) {
  const bool default_out = o.resume.empty() && o.cfg.out.empty() && !o.cfg.recipe.empty();
  if (default_out) {
    o.cfg.out = train::default_run_dir(o.cfg.recipe);
    std::cerr << "no --out given: the run goes to " << o.cfg.out << "\n";
  }
  if (o.nproc > 1) {
    if (std::getenv("WORLD_SIZE") != nullptr) throw Error("--nproc inside a launched worker (WORLD_SIZE is set)");
    std::cerr << "starting " << o.nproc << " data-parallel workers";
    if (o.cfg.expert_parallel > 1)
      std::cerr << " (routed experts spread over groups of " << o.cfg.expert_parallel << ")";
    std::cerr << "\n";
    auto args = train::command_line_without_nproc();
    if (default_out) args.insert(args.end(), {"--out", o.cfg.out});  // one directory, chosen once for every worker
    if (const int code = train::launch_workers(o.nproc, args); code != 0) throw CLI::RuntimeError(code);
    return;
  }
  if (o.threads > 0) torch::set_num_threads(o.threads);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::unique_ptr<train::Trainer> trainer;
  if (!o.resume.empty()) {
    // Only what was given on the command line overrides the saved configuration.
    nlohmann::json ov = nlohmann::json::object();
    auto given = [&](const char* flag) { return sub->get_option(flag)->count() > 0; };
    if (given("--steps")) ov["steps"] = o.cfg.steps;
    if (given("--tokens")) ov["token_budget"] = o.cfg.token_budget;
    if (given("--eval-every")) ov["eval_every"] = o.cfg.eval_every;
    if (given("--checkpoint-every")) ov["checkpoint_every"] = o.cfg.checkpoint_every;
    if (given("--keep-last")) ov["keep_last"] = o.cfg.keep_last;
    if (given("--log-every")) ov["log_every"] = o.cfg.log_every;
    if (given("--max-minutes")) ov["max_minutes"] = o.cfg.max_minutes;
    if (given("--profile-steps")) ov["profile_steps"] = o.cfg.profile_steps;
    if (given("--expert-parallel")) ov["expert_parallel"] = o.cfg.expert_parallel;
    if (given("--recompute")) ov["recompute"] = o.cfg.recompute;
    if (given("--cuda-graph")) ov["cuda_graph"] = o.cfg.cuda_graph;
    if (given("--bucket-elements")) ov["bucket_elements"] = o.cfg.bucket_elements;
    // New data (the next pack of a run spread over several GPU calls): the loader starts over on it.
    if (given("--data")) ov["data"] = data::resolve_training_data(o.cfg.data, std::cerr);
    for (const char* f : {"--recipe", "--init", "--batch", "--seq-len", "--accum", "--seed", "--optim", "--fim-rate",
                          "--fim-spm-rate", "--fim-domains"})
      if (given(f))
        throw Error(std::string(f) + " cannot change on --resume (the checkpoint's value is used for an exact resume)");
    trainer = std::make_unique<train::Trainer>(train::Trainer::resume(o.resume, ov, std::cerr));
  } else {
    if (o.cfg.recipe.empty() || o.cfg.data.empty())
      throw Error("slm train needs --recipe and --data (or --resume DIR)");
    o.cfg.data = data::resolve_training_data(o.cfg.data, std::cerr);
    o.cfg.lr.kind = o.schedule == "cosine" ? train::LrSchedule::Kind::Cosine : train::LrSchedule::Kind::Wsd;
    for (const auto& m : o.mix) {
      auto [k, v] = key_value(m, "--mix");
      if (!v.is_number()) throw Error("--mix " + m + ": the weight must be a number");
      o.cfg.mix[k] = v.get<double>();
    }
    if (!o.optim_overrides.empty()) {
      auto j = o.cfg.optim.to_json();
      for (const auto& kv : o.optim_overrides) {
        auto [k, v] = key_value(kv, "--optim");
        j[k] = v;
      }
      o.cfg.optim = train::OptimizerConfig::from_json(j);
    }
    trainer = std::make_unique<train::Trainer>(o.cfg, std::cerr);
  }
  trainer->run(&g_stop);
  std::cerr << "run directory: " << trainer->config().out << " (plot it with: slm plot " << trainer->config().out
            << ")\n";
  if (g_signal != 0) throw CLI::RuntimeError(128 + g_signal);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainCli>();
  auto& c = o->cfg;
  auto* t = app.add_subcommand("train", "Train a recipe on token shards (Muon + AdamW; checkpoints, exact resume)");
  t->add_option("--recipe", c.recipe, "recipe JSON file");
  t->add_option("--data", c.data,
                "shard directory from slm data shard: <domain>/{train,validation}-NNNNN.slmtok, or plain "
                "<prefix>-NNNNN.slmtok (one domain; its last ~1% is held out for validation); or a pack from slm data "
                "pack (unpacked once into <pack>.d). With --resume: continue on new data (the next pack)");
  t->add_option("--out", c.out,
                "run directory: checkpoints, metrics.jsonl, config.json (default: out/runs/<recipe file name>, "
                "with -2, -3, ... when taken)");
  t->add_option("--resume", o->resume, "continue the run in this directory from its latest checkpoint");
  t->add_option("--init", c.init,
                "start from the model weights of this run (its latest checkpoint) or checkpoint directory, with a "
                "fresh optimizer, schedule and data order: a specialist branched from a shared base, a fine-tune. "
                "The recipe must give the same tensors");
  t->add_option("--tokenizer", c.tokenizer,
                "tokenizer .model for bits per byte (default: the one the shards name, under tokenizer/; none: skip)");
  t->add_option("--domains", c.domains, "train on these domains only (default: every domain directory)")
      ->delimiter(',');
  t->add_option("--mix", o->mix, "sampling weight of a domain, e.g. --mix cpp=3 --mix cmake=1 (default 1 each)");
  t->add_option("--steps", c.steps, "optimizer steps")->capture_default_str();
  t->add_option("--tokens", c.token_budget, "training tokens (when --steps is 0)")->capture_default_str();
  t->add_option("--batch", c.batch, "sequences per micro-batch")->capture_default_str();
  t->add_option("--seq-len", c.seq_len, "tokens per sequence (0: the recipe's seq_len)")->capture_default_str();
  t->add_option("--accum", c.accum, "micro-batches per optimizer step")->capture_default_str();
  t->add_option("--seed", c.seed, "seed of the weight init and of the data order")->capture_default_str();
  t->add_option("--schedule", o->schedule, "LR schedule: wsd (warmup, constant, linear decay) or cosine")
      ->check(CLI::IsMember({"wsd", "cosine"}))
      ->capture_default_str();
  t->add_option("--warmup", c.lr.warmup_steps, "LR warmup steps")->capture_default_str();
  t->add_option("--decay-fraction", c.lr.decay_fraction, "WSD: fraction of the steps that decay")
      ->capture_default_str();
  t->add_option("--final-lr-fraction", c.lr.final_fraction, "LR multiplier reached at the end")->capture_default_str();
  t->add_option("--optim", o->optim_overrides,
                "optimizer setting key=value, e.g. --optim matrix_lr=0.01 (the group table printed at start lists "
                "them; docs/training.md)");
  t->add_option("--fim-rate", c.fim_rate,
                "fill-in-the-middle: the share of the documents of the --fim-domains whose training windows are "
                "rearranged into <|fim_prefix|> P <|fim_suffix|> S <|fim_middle|> M examples, split at characters "
                "(0: left-to-right only; docs/training.md)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  t->add_option("--fim-spm-rate", c.fim_spm_rate,
                "the share of the FIM examples in SPM order (<|fim_prefix|> <|fim_suffix|> S <|fim_middle|> P M), the "
                "rest PSM")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  t->add_option("--fim-domains", c.fim_domains,
                "the domains that get fill-in-the-middle (default: the code domains cpp, cpp-graphs, cmake, shell, "
                "algorithm, debug, review; plain shards are the domain named after their prefix, e.g. data)")
      ->delimiter(',')
      ->capture_default_str();
  t->add_option("--grad-clip", c.grad_clip, "clip the gradient norm to this, the DSA indexers' apart (0: off)")
      ->capture_default_str();
  t->add_option("--max-bad-steps", c.max_bad_steps, "stop after this many consecutive non-finite steps")
      ->capture_default_str();
  t->add_option("--eval-every", c.eval_every, "validation interval in steps (0: at the end only)")
      ->capture_default_str();
  t->add_option("--eval-batches", c.eval_batches, "validation micro-batches per domain")->capture_default_str();
  t->add_option("--checkpoint-every", c.checkpoint_every, "checkpoint interval in steps (0: at the end only)")
      ->capture_default_str();
  t->add_option("--keep-last", c.keep_last, "checkpoints kept")->capture_default_str();
  t->add_option("--log-every", c.log_every, "metrics.jsonl interval in steps")->capture_default_str();
  t->add_option("--dsa-warmup-steps", c.dsa_warmup_steps, "steps of the DSA indexer's dense warm-up stage")
      ->capture_default_str();
  t->add_option("--device", c.device, "cpu or cuda")->capture_default_str();
  t->add_option("--peak-tflops", c.peak_tflops, "device peak for MFU (0: known from the GPU's name)")
      ->capture_default_str();
  t->add_option("--max-minutes", c.max_minutes, "stop with a checkpoint after this much wall time (0: no limit)")
      ->capture_default_str();
  t->add_option("--profile-steps", c.profile_steps,
                "profile this many steps after two warm-up steps with libtorch's profiler: the top GPU kernels, "
                "launches per step and GPU idle time are printed and written with a Chrome trace to RUN/profile/")
      ->capture_default_str();
  t->add_option("--threads", o->threads, "CPU threads (0: torch's default)")->capture_default_str();
  t->add_option("--bucket-elements", c.bucket_elements,
                "data-parallel gradient bucket size in float32 elements (communication overlaps the backward)")
      ->capture_default_str();
  t->add_flag("--recompute,!--no-recompute", c.recompute,
              "activation checkpointing: the attention (without DSA), Mamba-3, M2RNN and dense MLP blocks keep only "
              "their inputs and run again in the backward (about a third more compute, far less activation memory; "
              "the results are the same)");
  t->add_flag("--cuda-graph,!--no-cuda-graph", c.cuda_graph,
              "replay each micro-batch's forward and backward from one CUDA graph (--device cuda): the step's "
              "thousands of kernel launches become one. Captured at the first step and again when a batch holds "
              "more documents than the graph was made for; costs a second copy of the activations' memory. Not with "
              "--nproc > 1, --recompute or DSA recipes");
  t->add_option("--expert-parallel", c.expert_parallel,
                "spread each MoE layer's routed experts over groups of this many workers (expert parallelism: tokens "
                "reach their experts by all-to-all); must divide --nproc and the recipe's routed experts. Checkpoints "
                "hold whole expert tensors, so a run resumes under any --nproc and --expert-parallel")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  t->add_option("--nproc", o->nproc,
                "data-parallel worker processes on this machine, one per GPU with --device cuda (NCCL) or CPU "
                "processes (gloo); --batch is the global batch and must divide by it. An external launcher may set "
                "RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT instead")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  t->callback([o, t] { run_train(*o, t); });

  struct PlotOptions {
    std::vector<std::string> dirs;
    std::string out;
  };
  auto po = std::make_shared<PlotOptions>();
  auto* p =
      app.add_subcommand("plot",
                         "Write PNG loss, bits-per-byte and learning-rate curves of a training run, or compare the "
                         "training loss of several runs against time (--out)");
  p->add_option("dir", po->dirs, "run directory (holds metrics.jsonl); with --out, two or more")->required();
  p->add_option("--out", po->out,
                "compare the runs: one PNG of each run's training loss against the minutes of its training steps "
                "(runs of different speed at equal time)");
  p->callback([po] {
    if (!po->out.empty()) {
      if (po->dirs.size() < 2) throw Error("slm plot --out compares runs: name two or more run directories");
      std::cout << train::plot_runs_by_time(po->dirs, po->out) << "\n";
      return;
    }
    if (po->dirs.size() != 1) throw Error("slm plot: one run directory, or several with --out to compare them");
    for (const auto& f : train::plot_run(po->dirs.front())) std::cout << f << "\n";
  });
}

}  // namespace slm::cli
