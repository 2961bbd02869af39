#pragma once
// The Python tests of `slm serve` (tests/server/*.py) run with the python of the test-only virtual environment that
// scripts/test-deps.sh makes (.venv-test/: openai, ollama, selenium, jsonschema). Without it they fail, naming the
// script that installs it; they never skip.
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "test_util.h"

namespace slm::test {

// SLM_TEST_PYTHON from the environment, else the virtual environment's (tests/CMakeLists.txt).
inline std::string test_python() {
  const char* p = std::getenv("SLM_TEST_PYTHON");
  return p && *p ? p : SLM_TEST_PYTHON;
}

// Runs tests/server/SCRIPT SLM_BINARY SLM_SOURCE_DIR ARGS with that python; stdout and stderr together.
inline CliResult run_python_test(const std::string& script, const std::string& args = "") {
  const std::string python = test_python();
  if (::access(python.c_str(), X_OK) != 0)
    return {-1, "no test python at " + python +
                    ": run scripts/test-deps.sh (it makes .venv-test/ with the test-only Python packages and installs "
                    "chromium and chromium-driver)"};
  const std::string cmd = "OMP_NUM_THREADS=1 '" + python + "' " + source_path("tests/server/" + script) + " " +
                          SLM_BINARY + " " + SLM_SOURCE_DIR + (args.empty() ? "" : " " + args) + " 2>&1 < /dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed: " + cmd};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace slm::test
