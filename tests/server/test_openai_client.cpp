// The official openai Python client against `slm serve` (tests/server/openai_client.py); skipped when the
// package is not installed.
#include <gtest/gtest.h>

#include "test_util.h"

namespace slm::server {
namespace {

TEST(ServerOpenAIClient, OfficialClientDrivesTheServer) {
  FILE* p = popen(("OMP_NUM_THREADS=1 python3 " + test::source_path("tests/server/openai_client.py") + " " +
                   SLM_BINARY + " " + SLM_SOURCE_DIR + " 2>&1")
                      .c_str(),
                  "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (out.rfind("SKIPPED", 0) == 0) GTEST_SKIP() << out;
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("OK: openai"), std::string::npos) << out;
}

}  // namespace
}  // namespace slm::server
