// `slm serve` as a process, driven on loopback by the official `ollama` Python client (tests/server/ollama_client.py,
// with the test-only virtual environment of scripts/test-deps.sh; a missing package fails the test, naming that
// script): list, show, generate with a suffix and chat, whole and streamed, the load request and the errors.
#include <gtest/gtest.h>

#include "python_test_util.h"

namespace slm::server {
namespace {

TEST(ServerOllamaClient, OfficialClientDrivesTheServer) {
  const auto r = test::run_python_test("ollama_client.py");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("OK: ollama"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace slm::server
