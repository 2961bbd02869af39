#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/recipe/accounting.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/report.h"

namespace slm::cli {

void add_recipe_command(CLI::App& app) {
  auto* recipe = app.add_subcommand("recipe", "Inspect and validate model recipes (JSON files under recipes/)");
  recipe->require_subcommand(1);

  struct ShowOptions {
    std::string file;
    bool json = false;
  };
  auto opts = std::make_shared<ShowOptions>();
  auto* show = recipe->add_subcommand(
      "show", "Print the expanded layer plan, the features on each layer, composition and parameter counts");
  show->add_option("file", opts->file, "recipe JSON file")->required();
  show->add_flag("--json", opts->json, "print one JSON object (depth, composition, layers, params, memory)");
  show->callback([opts] {
    Recipe r = load_recipe(opts->file);
    ModelPlan p = make_plan(r);
    Accounting a = account(r, p);
    if (opts->json) std::cout << recipe_report_json(r, p, a).dump(2) << "\n";
    else std::cout << recipe_report_text(r, p, a);
  });

  auto file = std::make_shared<std::string>();
  auto* validate = recipe->add_subcommand("validate", "Check a recipe; prints nothing but errors, exit code 2 if invalid");
  validate->add_option("file", *file, "recipe JSON file")->required();
  validate->callback([file] { load_recipe(*file); });
}

}  // namespace slm::cli
