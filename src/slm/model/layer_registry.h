#pragma once
// The ownership table: which class builds each pattern letter. docs/architecture.md ("Who owns a letter")
// documents the same table.
#include <memory>
#include <vector>

#include "slm/model/layer.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

struct LayerKind {
  char letter;
  const char* class_name;  // the Layer subclass
  const char* description;
};

const std::vector<LayerKind>& layer_kinds();
const LayerKind& layer_kind(char letter);

// Builds one layer of a plan (recipe parsing has already refused letters outside the table).
std::shared_ptr<Layer> make_layer(const Recipe& recipe, const LayerPlan& layer, const torch::TensorOptions& options);

}  // namespace slm::model
