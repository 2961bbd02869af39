// Ensemble manifests (recipe/ensemble.cpp), as `slm ensemble verify` and `slm serve --ensemble` read their own
// fields (the recipes they name are fuzz_recipe's). Bad input must be refused with slm::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz_util.h"
#include "slm/recipe/ensemble.h"
#include "slm/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      slm::fuzz::write_scratch("ensemble.json", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const slm::Ensemble e = slm::read_ensemble_manifest(path);
    if (e.specialists.empty()) std::abort();
    for (const auto& s : e.specialists)
      if (s.name.empty() || s.routes.empty() || (!s.sha256.empty() && s.sha256.size() != 64)) std::abort();
  } catch (const slm::Error& e) {
    slm::fuzz::rejected(e);
  }
  return 0;
}
