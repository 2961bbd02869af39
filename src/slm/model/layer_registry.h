#pragma once
// The ownership table: which class builds each pattern letter, and which letters and features have an
// implementation yet. docs/architecture.md ("Who owns a letter") documents the same table.
#include <memory>
#include <vector>

#include "slm/model/layer.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

struct LayerKind {
  char letter;
  const char* class_name;   // the Layer subclass, or the planned one while unimplemented
  const char* description;
  const char* available;    // nullptr when implemented, else where the implementation lands
};

const std::vector<LayerKind>& layer_kinds();
const LayerKind& layer_kind(char letter);

// Throws slm::Error naming the recipe file, the layer and the letter or feature when the plan (main stack
// or MTP modules) uses something without an implementation. Nothing is ever substituted.
void check_buildable(const Recipe& recipe, const ModelPlan& plan);

// Builds one layer of a plan checked by check_buildable.
std::shared_ptr<Layer> make_layer(const Recipe& recipe, const LayerPlan& layer, const torch::TensorOptions& options);

}  // namespace slm::model
