#include "slm/model/backend_summary.h"

#include <utility>
#include <vector>

#include "slm/model/layers/mamba3.h"
#include "slm/model/layers/moe.h"

namespace slm::model {

std::string backend_summary(HybridLM& model) {
  std::vector<std::pair<std::string, int>> seen;  // in first-seen order
  auto count = [&](const std::string& name) {
    for (auto& [n, c] : seen)
      if (n == name) return void(++c);
    seen.emplace_back(name, 1);
  };
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* moe = item.value()->as<MoEImpl>()) count(moe->backend_names());
    if (auto* mamba = item.value()->as<Mamba3Impl>()) count(mamba->backend().name());
  }
  std::string out;
  for (const auto& [name, c] : seen) out += (out.empty() ? "" : "; ") + name + " x" + std::to_string(c);
  return out.empty() ? "one form per layer" : out;
}

}  // namespace slm::model
