// Recipes (recipe/recipe.cpp, plan.cpp, accounting.cpp, report.cpp), as `slm recipe show` reads one: parse and
// validate, then the plan, the parameter accounting and both reports. Bad input must be refused with slm::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "slm/recipe/accounting.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"
#include "slm/recipe/report.h"
#include "slm/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const slm::Recipe r = slm::parse_recipe_text(text, "fuzz.json");
    const slm::ModelPlan plan = slm::make_plan(r);
    if (static_cast<int>(plan.layers.size()) != r.depth) std::abort();
    const slm::Accounting acc = slm::account(r, plan);
    (void)slm::recipe_report_json(r, plan, acc).dump();
    (void)slm::recipe_report_text(r, plan, acc);
  } catch (const slm::Error& e) {
    slm::fuzz::rejected(e);
  }
  return 0;
}
