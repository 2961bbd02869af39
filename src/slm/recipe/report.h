#pragma once
// What `slm recipe show` and `slm ensemble show` print, as JSON objects and as readable text.
#include <nlohmann/json.hpp>

#include <string>

#include "slm/recipe/accounting.h"
#include "slm/recipe/ensemble.h"
#include "slm/recipe/plan.h"

namespace slm {

nlohmann::json recipe_report_json(const Recipe& recipe, const ModelPlan& plan, const Accounting& acc);
std::string recipe_report_text(const Recipe& recipe, const ModelPlan& plan, const Accounting& acc);

nlohmann::json ensemble_report_json(const Ensemble& e);
std::string ensemble_report_text(const Ensemble& e);

}  // namespace slm
