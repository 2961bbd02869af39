// `slm serve` as a process, driven from Python on loopback (tests/server/*.py, with the test-only virtual environment
// of scripts/test-deps.sh; a test whose package is missing fails, naming that script): the official openai client,
// and every response and stream chunk validated against the JSON schemas of OpenAI's published OpenAPI spec.
#include <gtest/gtest.h>

#include "python_test_util.h"

namespace slm::server {
namespace {

TEST(ServerOpenAIClient, OfficialClientDrivesTheServer) {
  const auto r = test::run_python_test("openai_client.py");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("OK: openai"), std::string::npos) << r.out;
}

// tests/server/data/openai_schema.json: CreateChatCompletionResponse, CreateChatCompletionStreamResponse,
// CreateCompletionResponse and what they reference; the script also checks that the server's answers as they were
// before (no `refusal` in the message, `system_fingerprint: null`) fail them.
TEST(ServerOpenAISchema, ResponsesMatchOpenAIsPublishedSchema) {
  const auto r = test::run_python_test("openai_schema.py");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("OK: slm serve's chat and completion responses"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace slm::server
