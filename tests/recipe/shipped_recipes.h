#pragma once
// Every model recipe the repository ships (recipes/**/*.json except the ensemble manifests, the data pipeline's
// configuration under recipes/data and the ablation plans under recipes/ablations), sorted.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace slm::test {

inline std::vector<std::string> shipped_recipes() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(source_path("recipes")))
    if (e.path().extension() == ".json" && e.path().parent_path().filename() != "ensembles" &&
        e.path().parent_path().filename() != "data" && e.path().parent_path().filename() != "ablations")
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace slm::test
