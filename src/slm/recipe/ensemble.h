#pragma once
// Ensemble manifests: the specialists of a lineup, each with its domain, recipe and, for serving, its checkpoint,
// tokenizer and the router labels it answers; plus the router's model file. Paths are relative to the manifest's
// directory. Every serving field is optional, so manifests written before them still read (docs/serving.md).
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
  std::string checkpoint;   // weights file or checkpoint directory (BF16/FP32 or NVFP4); empty until trained
  std::string tokenizer;    // the code tokenizer .model it was trained with; empty: none given
  std::vector<std::string> routes;  // router labels this specialist answers (default: its name)
  double target_total = 0;  // the size the product documents state for it (0 = none)
  double target_active = 0;
  Recipe recipe;
  Accounting accounting;
};

struct Ensemble {
  std::string source;
  std::string name;
  std::string description;
  std::string router;  // router model file (slm router train); empty: none
  std::vector<Specialist> specialists;
  long long total = 0, active = 0, stored = 0, bytes_bf16 = 0, bytes_nvfp4 = 0;
};

Ensemble load_ensemble(const std::string& path);

}  // namespace slm
