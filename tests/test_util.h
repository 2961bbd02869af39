#pragma once
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "slm/recipe/recipe.h"
#include "slm/util/error.h"

namespace slm::test {

inline std::string source_path(const std::string& rel) { return std::string(SLM_SOURCE_DIR) + "/" + rel; }

// A small valid recipe with every block family; tests change one thing and check the outcome.
inline nlohmann::json base_recipe() {
  return nlohmann::json::parse(R"({
    "name": "t", "vocab_size": 64, "d_model": 16, "depth": 12, "pattern": "AEMEAEMEAEMR", "seq_len": 32,
    "attention": {"heads": 4, "kv_heads": 2, "head_dim": 4},
    "mamba3": {"d_state": 8, "expand": 2, "headdim": 8},
    "moe": {"routed_experts": 4, "experts_per_token": 2, "expert_hidden": 8},
    "m2rnn": {"heads": 2, "k_head_dim": 4, "v_head_dim": 4}
  })");
}

inline Recipe parse(const nlohmann::json& j) { return parse_recipe_text(j.dump(2), "test.json"); }

// Expects parsing to fail with a message containing every fragment.
inline void expect_error(const nlohmann::json& j, std::initializer_list<std::string> fragments) {
  try {
    parse(j);
    ADD_FAILURE() << "expected an error for " << j.dump();
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
  }
}

}  // namespace slm::test
