#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/recipe/ensemble.h"
#include "slm/recipe/report.h"

namespace slm::cli {

void add_ensemble_command(CLI::App& app) {
  auto* ens = app.add_subcommand("ensemble", "Inspect ensemble manifests (recipes/ensembles/*.json)");
  ens->require_subcommand(1);
  struct Options {
    std::string file;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  auto* show = ens->add_subcommand(
      "show", "Print each specialist's total/active parameters, the sums, and weight memory in BF16 and NVFP4");
  show->add_option("manifest", opts->file, "ensemble manifest JSON file")->required();
  show->add_flag("--json", opts->json, "print one JSON object (specialists, total, bytes_bf16, bytes_nvfp4)");
  show->callback([opts] {
    Ensemble e = load_ensemble(opts->file);
    if (opts->json) std::cout << ensemble_report_json(e).dump(2) << "\n";
    else std::cout << ensemble_report_text(e);
  });
}

}  // namespace slm::cli
