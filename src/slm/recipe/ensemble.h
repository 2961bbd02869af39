#pragma once
// Ensemble manifests: the specialists of a lineup, each with its domain, recipe and (later) checkpoint.
#include <optional>
#include <string>
#include <vector>

#include "slm/recipe/accounting.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm {

struct Specialist {
  std::string name;
  std::string domain;
  std::string recipe_path;  // resolved against the manifest's directory
  std::string checkpoint;   // empty until trained
  double target_total = 0;  // the size the product documents state for it (0 = none)
  double target_active = 0;
  Recipe recipe;
  Accounting accounting;
};

struct Ensemble {
  std::string source;
  std::string name;
  std::string description;
  std::vector<Specialist> specialists;
  long long total = 0, active = 0, stored = 0, bytes_bf16 = 0, bytes_nvfp4 = 0;
};

Ensemble load_ensemble(const std::string& path);

}  // namespace slm
