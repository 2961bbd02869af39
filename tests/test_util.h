#pragma once
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "slm/recipe/recipe.h"
#include "slm/util/error.h"

namespace slm::test {

// Built by appending, not `std::string(SLM_SOURCE_DIR) + "/" + rel`: with a source path of 16 characters or more
// (CI clones into /check/work/main) GCC 12 at -O3 sees that temporary's inlined move and reports -Warray-bounds on
// libstdc++'s memcpy (a false positive of its range analysis, GCC bug 105329), which -Werror made CI's failure.
inline std::string source_path(const std::string& rel) {
  std::string path = SLM_SOURCE_DIR;
  path += '/';
  path += rel;
  return path;
}

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

struct CliResult {
  int code;         // exit status (-1 if the program did not exit normally)
  std::string out;  // stdout and stderr together
};

// Runs the slm program as a user would, with one intra-op thread (ctest already runs a process per core).
// stdin_text, when given, is fed on standard input through a file unique to this process; cwd, when given, is the
// working directory it runs in (for what it finds or writes relative to it); binary, when given, is a copy of the
// program to run instead (for what it finds relative to itself).
inline CliResult run_slm(const std::string& args, const std::optional<std::string>& stdin_text = std::nullopt,
                         const std::string& cwd = "", const std::string& binary = SLM_BINARY) {
  std::string cmd = (cwd.empty() ? "" : "cd '" + cwd + "' && ") + "OMP_NUM_THREADS=1 " + binary + " " + args;
  if (stdin_text) {
    static int counter = 0;
    std::string path = testing::TempDir() + "/slm_stdin_" + std::to_string(getpid()) + "_" +
                       std::to_string(counter++) + ".txt";
    std::ofstream(path, std::ios::binary) << *stdin_text;
    cmd += " < " + path;
  }
  cmd += " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace slm::test
