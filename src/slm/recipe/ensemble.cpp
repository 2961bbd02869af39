#include "slm/recipe/ensemble.h"

#include <filesystem>

#include "slm/util/json_reader.h"

namespace slm {

Ensemble load_ensemble(const std::string& path) {
  nlohmann::json j = parse_json_file(path);
  JsonObjectReader r(j, "", path);
  Ensemble e;
  e.source = path;
  e.name = r.get_string("name");
  e.description = r.get_string("description", "");
  const auto dir = std::filesystem::path(path).parent_path();
  auto resolve = [&](const std::string& p) { return p.empty() ? p : (dir / p).lexically_normal().string(); };
  e.router = resolve(r.get_string("router", ""));
  const auto& list = r.get("specialists");
  if (!list.is_array() || list.empty()) r.fail("specialists", "expected a non-empty list of specialists");
  for (size_t i = 0; i < list.size(); ++i) {
    JsonObjectReader s(list[i], "specialists[" + std::to_string(i) + "]", path);
    Specialist sp;
    sp.name = s.get_string("name");
    for (const auto& other : e.specialists)
      if (other.name == sp.name) s.fail("name", "duplicate specialist name \"" + sp.name + "\"");
    sp.domain = s.get_string("domain");
    sp.recipe_path = (dir / s.get_string("recipe")).lexically_normal().string();
    sp.checkpoint = resolve(s.get_string("checkpoint", ""));
    sp.tokenizer = resolve(s.get_string("tokenizer", ""));
    if (s.has("routes")) {
      const auto& routes = s.get("routes");
      if (!routes.is_array() || routes.empty())
        s.fail("routes", "expected a non-empty list of router labels (e.g. [\"cpp\", \"algorithm\"])");
      for (const auto& l : routes) {
        if (!l.is_string() || l.get<std::string>().empty()) s.fail("routes", "router labels must be non-empty strings");
        sp.routes.push_back(l.get<std::string>());
      }
    } else {
      sp.routes = {sp.name};
    }
    if (s.has("target")) {
      auto t = s.object("target");
      sp.target_total = t.get_double("total");
      sp.target_active = t.get_double("active");
      t.reject_unknown_keys();
    }
    s.reject_unknown_keys();
    sp.recipe = load_recipe(sp.recipe_path);
    sp.accounting = account(sp.recipe, make_plan(sp.recipe));
    e.total += sp.accounting.total;
    e.active += sp.accounting.active;
    e.stored += sp.accounting.stored;
    e.bytes_bf16 += sp.accounting.bytes_bf16;
    e.bytes_nvfp4 += sp.accounting.bytes_nvfp4;
    e.specialists.push_back(std::move(sp));
  }
  r.reject_unknown_keys();
  return e;
}

}  // namespace slm
