#pragma once
// The ablation runner of issue 18 (`slm eval ablations`): a declared plan of arms (recipes, or one base recipe with
// JSON overrides) trained with the same data, tokens, seed and schedule, then scored on the same held-out windows;
// the result is the per-domain table of domain_table.h with one column per arm, a table of the arms (parameters,
// tokens, time) and a PNG chart. Each arm keeps its run and result under <out>/<arm>/, so an interrupted plan (or one
// spread over several GPU calls) continues with the arms not finished.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slm/train/evaluate.h"

namespace slm::eval {

struct AblationArm {
  std::string name;
  std::string recipe;        // recipe file ("": the plan's base)
  nlohmann::json overrides;  // merged into the recipe (RFC 7386 merge patch); null: none
};

struct AblationPlan {
  std::string name, notes, source;
  std::string base;      // default recipe file of the arms
  nlohmann::json train;  // TrainConfig fields shared by every arm (steps, batch, seq_len, seed, lr, optim, ...)
  nlohmann::json eval;   // held-out windows: split, batch, seq_len, batches
  std::vector<AblationArm> arms;
};

// Reads and checks a plan: at least two arms, unique names made of letters, digits, '-', '_' and '.', a recipe for
// every arm, known TrainConfig keys in "train" (data, out and recipe are the runner's). Recipe paths are relative to
// the working directory. Throws slm::Error naming the file and the problem.
AblationPlan load_ablation_plan(const std::string& path);
AblationPlan parse_ablation_plan(const nlohmann::json& j, const std::string& source);

// An arm's recipe as JSON: its file (or the plan's base) with its overrides merged in and the name
// "<plan>-<arm>". Throws slm::Error when the file cannot be read or parsed.
nlohmann::json arm_recipe(const AblationPlan& plan, const AblationArm& arm);

struct AblationOptions {
  std::string data;  // shard directory: every arm trains on it and is scored on its held-out split
  std::string out;   // <out>/<arm>/{recipe.json, run/, result.json}, <out>/ablations.{md,json,png}
  std::string device = "cpu";
  int64_t steps = 0;              // > 0: overrides the plan's steps (a quick pass)
  std::vector<std::string> arms;  // only these arms (empty: all)
};

struct ArmResult {
  std::string name, recipe_file, run_dir;
  int64_t params = 0, active_params = 0;  // the recipe's accounting
  int64_t steps = 0, tokens = 0;          // trained
  double seconds = 0;                     // training wall time (this and earlier calls)
  std::map<std::string, train::DomainScore> scores;
  nlohmann::json to_json() const;
  static ArmResult from_json(const nlohmann::json& j);
};

// Trains and scores every arm not finished yet (an arm is finished when <out>/<arm>/result.json exists; a run
// directory with a checkpoint but no result is resumed). Returns every requested arm's result, in plan order.
std::vector<ArmResult> run_ablations(const AblationPlan& plan, const AblationOptions& options, std::ostream& log);

// "| arm | recipe | params | active | steps | tokens | train time | <pooled measure> |" then the per-domain table
// (domain_table_markdown) with one column per arm.
std::string ablation_markdown(const AblationPlan& plan, const std::vector<ArmResult>& results);
nlohmann::json ablation_json(const AblationPlan& plan, const std::vector<ArmResult>& results);

}  // namespace slm::eval
