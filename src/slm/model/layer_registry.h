#pragma once
// The ownership table: which class builds each block family (the letter table, recipe/letters.h, ties a letter to
// its family). docs/architecture.md ("Who owns a letter") documents both.
#include <memory>
#include <vector>

#include "slm/model/layer.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

struct LayerKind {
  Family family;
  const char* class_name;  // the Layer subclass
  const char* description;
};

const std::vector<LayerKind>& layer_kinds();
const LayerKind& layer_kind(Family family);
const LayerKind& layer_kind(char letter);  // the kind of the letter's family

// Builds one layer of a plan (recipe parsing has already refused letters outside the table).
std::shared_ptr<Layer> make_layer(const Recipe& recipe, const LayerPlan& layer, const torch::TensorOptions& options);

}  // namespace slm::model
