// `slm chat --url` (src/slm/server/chat_client.cpp, HttpChat) against `slm serve` running as a process of its own, as
// a user runs them: the streamed answer is the server's, a second turn carries the conversation, the API key is
// sent, and a wrong key, a server that is not there and a URL it cannot use are reported with exit status 2.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>

#include "test_util.h"

extern char** environ;

namespace slm::server {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// `slm serve ARGS --port 0 --quiet` as a child process; port() once it said where it listens.
class ServeProcess {
 public:
  explicit ServeProcess(const std::string& args) {
    const std::string cmd = "unset SLM_API_KEY; OMP_NUM_THREADS=1 exec '" + std::string(SLM_BINARY) + "' serve " +
                            args + " --port 0 --quiet";
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
    const int rc = posix_spawn(&pid_, "/bin/sh", &fa, nullptr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    fd_ = fds[0];
    if (rc != 0) throw std::runtime_error("posix_spawn failed");
    // Its stderr, line by line, until it names the port or a deadline passes.
    const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    std::smatch m;
    while (port_ == 0) {
      if (!read_some(deadline)) break;
      if (std::regex_search(log_, m, listening)) port_ = std::stoi(m[1]);
    }
  }
  ~ServeProcess() {
    ::kill(pid_, SIGTERM);
    // The pipe closes when the server has exited; past the deadline it is killed.
    while (read_some(Clock::now() + std::chrono::seconds(30))) {
    }
    if (::waitpid(pid_, nullptr, WNOHANG) == 0) ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ::close(fd_);
  }
  int port() const { return port_; }
  const std::string& log() const { return log_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  // Appends what the server wrote; false at the end of its output or at the deadline.
  bool read_some(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    log_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  std::string log_;
};

std::string tiny_model() {
  return "--recipe " + test::source_path("recipes/tiny-hybrid.json") + " --random-weights --tokenizer " +
         test::source_path("tokenizer/slm-code-512.model");
}

// The server's own answer to a conversation, greedy, as the chat client asks for it.
Json api_answer(const ServeProcess& s, const std::string& key, const Json& messages, int max_tokens) {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120);
  const Json body = {{"model", "auto"}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  auto res = c.Post("/v1/chat/completions", {{"Authorization", "Bearer " + key}}, body.dump(), "application/json");
  if (!res || res->status != 200) {
    ADD_FAILURE() << "the API did not answer: " << (res ? res->body : httplib::to_string(res.error()));
    return Json::object();
  }
  return Json::parse(res->body);
}

TEST(ServerChatUrl, TalksToARunningSlmServeWithItsApiKeyAndKeepsTheConversation) {
  ServeProcess serve(tiny_model() + " --api-key sekrit");
  ASSERT_NE(serve.port(), 0) << serve.log();
  const std::string first = "Explain RAII.", second = "And in C?";
  const Json a1 = api_answer(serve, "sekrit", {{{"role", "user"}, {"content", first}}}, 12);
  ASSERT_TRUE(a1.contains("choices")) << a1;
  const std::string t1 = a1["choices"][0]["message"]["content"];
  const Json a2 = api_answer(serve, "sekrit",
                             {{{"role", "user"}, {"content", first}},
                              {{"role", "assistant"}, {"content", t1}},
                              {{"role", "user"}, {"content", second}}},
                             12);
  ASSERT_TRUE(a2.contains("choices")) << a2;
  const std::string t2 = a2["choices"][0]["message"]["content"];
  ASSERT_FALSE(t1.empty());

  // Piped input: each line a turn, the second sent with the first answer; each answer streams to stdout.
  const auto r = test::run_slm("chat --url " + serve.url() + " --api-key sekrit --temperature 0 --max-tokens 12",
                               first + "\n" + second + "\n/quit\n");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(t1 + "\n"), std::string::npos) << r.out << "\nexpected first: " << t1;
  EXPECT_NE(r.out.find(t2 + "\n"), std::string::npos) << r.out << "\nexpected second: " << t2;
  for (const Json* a : {&a1, &a2})
    EXPECT_NE(r.out.find("(answered by tiny-hybrid, finish " + (*a)["choices"][0]["finish_reason"].get<std::string>() +
                         ")"),
              std::string::npos)
        << r.out;

  // --prompt: one message, then exit.
  const auto p = test::run_slm("chat --url " + serve.url() + " --api-key sekrit --temperature 0 --max-tokens 12 "
                               "--prompt '" + first + "'");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find(t1 + "\n"), std::string::npos) << p.out;
}

TEST(ServerChatUrl, ReportsAWrongKeyAnAbsentServerAndABadUrl) {
  ServeProcess serve(tiny_model() + " --api-key sekrit");
  ASSERT_NE(serve.port(), 0) << serve.log();
  for (const std::string key : {"", " --api-key wrong"}) {
    const auto r = test::run_slm("chat --url " + serve.url() + key + " --max-tokens 4 --prompt hello");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("the server answered HTTP 401: missing or wrong API key"), std::string::npos) << r.out;
  }

  // A port that refuses connections: bound, so no one else takes it, and not listening.
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const auto absent = test::run_slm("chat --url http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) +
                                    " --max-tokens 4 --prompt hello");
  ::close(sock);
  EXPECT_EQ(absent.code, 2) << absent.out;
  EXPECT_NE(absent.out.find("chat: no answer from the server ("), std::string::npos) << absent.out;

  const auto bad = test::run_slm("chat --url ftp://127.0.0.1:21 --prompt hello");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("chat: cannot use the URL ftp://127.0.0.1:21"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace slm::server
