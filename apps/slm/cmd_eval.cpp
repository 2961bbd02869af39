// slm eval: held-out loss and bits per byte per domain of a training checkpoint or an NVFP4 checkpoint; its
// subcommands hold the other evaluations (humaneval: cmd_eval_humaneval.cpp).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "slm/train/evaluate.h"
#include "slm/util/error.h"

namespace slm::cli {

namespace {

struct EvalCli {
  train::CheckpointEval req;
  int threads = 0;
  bool json = false;
};

nlohmann::json score_json(const train::DomainScore& s) {
  return {{"loss", s.loss},
          {"bpb", std::isnan(s.bpb) ? nlohmann::json() : nlohmann::json(s.bpb)},
          {"tokens", s.tokens},
          {"bytes", s.bytes},
          {"batches", s.batches}};
}

void print_scores(const train::CheckpointEval& req, const train::CheckpointScores& r, bool json) {
  if (json) {
    nlohmann::json j = {{"weights", r.weights},
                        {"recipe", r.recipe},
                        {"step", r.step < 0 ? nlohmann::json() : nlohmann::json(r.step)},
                        {"split", req.split},
                        {"batch", r.windows.batch},
                        {"seq_len", r.windows.seq_len},
                        {"batches", r.windows.batches},
                        {"tokenizer", r.tokenizer},
                        {"nvfp4_weights", r.nvfp4_weights},
                        {"bf16_autocast", r.bf16},
                        {"all", score_json(r.all)}};
    j["domains"] = nlohmann::json::object();
    for (const auto& [d, s] : r.domains) j["domains"][d] = score_json(s);
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf(
      "%s (recipe %s%s), %s split, windows of %lld tokens, up to %lld per domain, %s\n", r.weights.c_str(),
      r.recipe.c_str(), r.step >= 0 ? (", step " + std::to_string(r.step)).c_str() : "", req.split.c_str(),
      static_cast<long long>(r.windows.seq_len), static_cast<long long>(r.windows.batch * r.windows.batches),
      (r.nvfp4_weights > 0 ? std::to_string(r.nvfp4_weights) + " weights in NVFP4" : std::string("dense weights"))
          .append(r.bf16 ? ", BF16 autocast" : "")
          .c_str());
  std::printf("%-16s %10s %10s %10s %10s\n", "domain", "tokens", "loss", "ppl", "bpb");
  auto line = [](const std::string& name, const train::DomainScore& s) {
    char bpb[32] = "-";
    if (!std::isnan(s.bpb)) std::snprintf(bpb, sizeof bpb, "%.4f", s.bpb);
    std::printf("%-16s %10lld %10.4f %10.3f %10s\n", name.c_str(), static_cast<long long>(s.tokens), s.loss,
                std::exp(s.loss), bpb);
  };
  for (const auto& [d, s] : r.domains) line(d, s);
  if (r.domains.size() > 1) line("all", r.all);
  std::printf("(loss: mean NLL per token in nats; bpb: bits per byte of the targets%s)\n",
              r.tokenizer.empty() ? ", needs a tokenizer" : (", bytes from " + r.tokenizer).c_str());
}

}  // namespace

void add_eval_humaneval_command(CLI::App* eval);  // cmd_eval_humaneval.cpp
void add_eval_domains_command(CLI::App* eval);    // cmd_eval_domains.cpp
void add_eval_ablations_command(CLI::App* eval);  // cmd_eval_ablations.cpp
void add_eval_fim_command(CLI::App* eval);        // cmd_eval_fim.cpp

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalCli>();
  auto& q = o->req;
  auto* e = app.add_subcommand("eval",
                               "Held-out loss and bits per byte per domain of a training checkpoint or an NVFP4 "
                               "checkpoint (slm quantize)");
  e->add_option("--checkpoint", q.checkpoint,
                "training checkpoint (ckpt-NNNNNNNN), run directory (its latest), or weights file (.safetensors, "
                "NVFP4 or dense); required without a subcommand");
  e->add_option("--recipe", q.recipe, "recipe file (required for a weights file; a training checkpoint has its own)");
  e->add_option("--data", q.data,
                "shard directory: <domain>/<split>-NNNNN.slmtok or plain <prefix>-NNNNN.slmtok (default: the run's)");
  e->add_option("--split", q.split, "validation or test")->capture_default_str();
  e->add_option("--domains", q.domains, "these domains only (default: the run's, else every domain)")->delimiter(',');
  e->add_option("--tokenizer", q.tokenizer,
                "tokenizer .model for bits per byte (default: the run's, else the one the shards name; none: skip)");
  e->add_option("--batch", q.batch, "sequences per batch (0: the run's, else 8)")->capture_default_str();
  e->add_option("--seq-len", q.seq_len, "tokens per sequence (0: the run's, else the recipe's)")->capture_default_str();
  e->add_option("--batches", q.batches, "batches per domain (0: the run's eval_batches, else 4)")
      ->capture_default_str();
  e->add_option("--device", q.device, "cpu or cuda")->capture_default_str();
  e->add_option("--threads", o->threads, "CPU threads (0: torch's default)")->capture_default_str();
  e->add_flag("--bf16", q.bf16, "compute under BF16 autocast (as training on a GPU does); weights as loaded");
  e->add_flag("--json", o->json, "print JSON");
  add_eval_humaneval_command(e);
  add_eval_domains_command(e);
  add_eval_ablations_command(e);
  add_eval_fim_command(e);
  e->require_subcommand(0, 1);
  e->callback([o, e] {
    if (!e->get_subcommands().empty()) return;  // a subcommand ran instead
    if (o->req.checkpoint.empty())
      throw Error("slm eval: --checkpoint is required (or a subcommand: humaneval, domains)");
    if (o->threads > 0) torch::set_num_threads(o->threads);
    print_scores(o->req, train::evaluate_checkpoint(o->req), o->json);
  });
}

}  // namespace slm::cli
