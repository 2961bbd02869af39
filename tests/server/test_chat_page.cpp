// The chat page (GET /, src/slm/server/web_page.cpp) in headless Chromium: tests/server/chat_page.py starts
// `slm serve`, sends a prompt from the page and waits for the streamed answer and the specialist's name to appear
// there. Needs scripts/test-deps.sh (selenium, chromium, chromium-driver): fails without them.
// It leaves a screenshot beside the program (build/chat-page.png), not in the source tree: Chromium's antialiasing of
// the bubbles' corners differs by a few bytes from run to run. docs/images/chat-page.png is refreshed with
//   SLM_CHAT_PAGE_SCREENSHOT=$PWD/docs/images/chat-page.png build/slm_tests --gtest_filter='ServerChatPage.*'
#include <gtest/gtest.h>

#include <cstdlib>

#include "python_test_util.h"

namespace slm::server {
namespace {

TEST(ServerChatPage, StreamsTheAnswerAndNamesTheSpecialistInHeadlessChromium) {
  const char* env = std::getenv("SLM_CHAT_PAGE_SCREENSHOT");
  std::string screenshot = env && *env ? env : std::string(SLM_BINARY);
  if (!(env && *env)) screenshot = screenshot.substr(0, screenshot.rfind('/') + 1) + "chat-page.png";
  const auto r = test::run_python_test("chat_page.py", "'" + screenshot + "'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("OK: the chat page streamed"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace slm::server
