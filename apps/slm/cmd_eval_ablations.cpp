// slm eval ablations: a declared plan of recipe arms trained alike and scored on the same held-out windows
// (src/slm/eval/ablation.h); Markdown, JSON and a PNG chart.
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/data/pack.h"
#include "slm/eval/ablation.h"
#include "slm/eval/domain_table.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::cli {

namespace {

struct AblationsCli {
  std::string plan;
  eval::AblationOptions options;
  int threads = 0;
  bool json = false;
};

void run_ablations_cli(AblationsCli& c) {
  if (c.threads > 0) torch::set_num_threads(c.threads);
  const auto plan = eval::load_ablation_plan(c.plan);
  c.options.data = data::resolve_training_data(c.options.data, std::cerr);  // a pack is unpacked once
  const auto results = eval::run_ablations(plan, c.options, std::cerr);
  const std::string md = eval::ablation_markdown(plan, results);
  const auto j = eval::ablation_json(plan, results);
  const std::string& out = c.options.out;
  write_file_atomic(out + "/ablations.md", md);
  write_file_atomic(out + "/ablations.json", j.dump(2) + "\n");
  std::vector<std::pair<std::string, eval::DomainScores>> scores;
  for (const auto& r : results) scores.emplace_back(r.name, r.scores);
  std::string png;
  try {
    png = eval::plot_domain_table(eval::make_domain_table(scores), out);
  } catch (const Error& e) {  // the tables are the result; a machine without gnuplot still gets them
    std::fprintf(stderr, "slm: warning: no chart: %s\n", e.what());
  }
  std::fprintf(stderr, "wrote %s/ablations.md and ablations.json%s%s\n", out.c_str(), png.empty() ? "" : " and ",
               png.c_str());
  std::cout << (c.json ? j.dump(2) + "\n" : md);
}

}  // namespace

void add_eval_ablations_command(CLI::App* eval) {
  auto c = std::make_shared<AblationsCli>();
  auto* a = eval->add_subcommand(
      "ablations",
      "Train each arm of an ablation plan (recipes/ablations/*.json: recipes or one base with overrides, the same "
      "data, tokens, seed and schedule) and score all on the same held-out windows; an interrupted plan continues "
      "with the arms not finished (docs/evaluation.md)");
  a->add_option("--plan", c->plan, "ablation plan (JSON)")->required();
  a->add_option("--data", c->options.data, "shard directory or .slmpack: training data and held-out splits")->required();
  a->add_option("--out", c->options.out, "output directory: <arm>/ runs and results, ablations.md/.json/.png")
      ->required();
  a->add_option("--device", c->options.device, "cpu or cuda")->capture_default_str();
  a->add_option("--steps", c->options.steps, "train this many steps instead of the plan's (0: the plan's)")
      ->capture_default_str();
  a->add_option("--arms", c->options.arms, "only these arms (default: all)")->delimiter(',');
  a->add_option("--threads", c->threads, "CPU threads (0: torch's default)")->capture_default_str();
  a->add_flag("--json", c->json, "print JSON instead of Markdown");
  a->callback([c] { run_ablations_cli(*c); });
}

}  // namespace slm::cli
