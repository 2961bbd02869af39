#pragma once
// Shared by the evaluation tests: the MultiPL-E problem file (outside the repository: its license keeps it out of
// anything a corpus could be built from) and temporary files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "slm/eval/problems.h"
#include "test_util.h"

namespace slm::test {

inline std::string humaneval_file() {
  return source_path("../shared/eval/multipl-e/humaneval-cpp.jsonl");
}

// The named problems of the real file; skips the test when the file is not on this machine.
#define SLM_REQUIRE_HUMANEVAL()                                   \
  if (::access(::slm::test::humaneval_file().c_str(), R_OK) != 0) \
  GTEST_SKIP() << ::slm::test::humaneval_file() << " is not on this machine"

inline eval::Problem humaneval_problem(const std::string& name) {
  for (auto& p : eval::load_problems(humaneval_file()))
    if (p.name == name) return p;
  throw Error("no problem " + name);
}

inline std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + std::to_string(getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace slm::test
