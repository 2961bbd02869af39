// The sandbox against programs that try to get out: the network, files outside their directory, process limits,
// and processes that outlive the program. Each isolation claim is checked against a control run that shows the
// same program does get through without it.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "eval_test_util.h"
#include "slm/eval/sandbox.h"
#include "slm/util/process.h"

using namespace slm;
using namespace slm::test;

namespace {

std::string fresh_dir() {
  std::string t = testing::TempDir() + "/slm-sandbox-test-XXXXXX";
  if (!mkdtemp(t.data())) throw Error("mkdtemp failed");
  chmod(t.c_str(), 0755);
  return t;
}

// Builds a helper program with g++ directly (not through the code under test).
std::string build(const std::string& name, const std::string& source) {
  static const std::string dir = fresh_dir();
  const std::string src = dir + "/" + name + ".cpp", bin = dir + "/" + name;
  if (::access(bin.c_str(), X_OK) == 0) return bin;
  std::ofstream(src) << source;
  ProcessOptions po;
  po.timeout_s = 120;
  const auto r = run_process({"g++", "-O1", "-o", bin, src}, po);
  if (!r.ok()) throw Error("building " + name + " failed: " + r.err);
  return bin;
}

bool group_gone(int pgid) {
  return kill(-pgid, 0) != 0 && errno == ESRCH;
}

#define REQUIRE_NAMESPACES()                           \
  if (auto why = eval::Sandbox::probe(); !why.empty()) \
  GTEST_SKIP() << "namespaces are not available here (" << why << "): the none mode is documented as not isolating"

const char* kConnect = R"(
#include <arpa/inet.h>
#include <cstdio>
#include <cstdlib>
#include <netinet/in.h>
#include <sys/socket.h>
int main(int, char** argv) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(atoi(argv[1]));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, (sockaddr*)&a, sizeof a) == 0) { puts("connected"); return 0; }
  perror("connect");
  return 3;
})";

const char* kEscape = R"(
#include <cstdio>
#include <fcntl.h>
#include <unistd.h>
int main(int, char** argv) {
  int in = open("inside.txt", O_CREAT | O_WRONLY, 0644);
  if (in < 0 || write(in, "ok", 2) != 2) { perror("inside"); return 4; }
  int out = open(argv[1], O_CREAT | O_WRONLY, 0644);
  if (out < 0) { perror("outside"); return 3; }
  return 0;
})";

const char* kForker = R"(
#include <cstdio>
#include <unistd.h>
int main() {
  int made = 0;
  for (int i = 0; i < 500; ++i) {
    pid_t p = fork();
    if (p == 0) { pause(); _exit(0); }
    if (p < 0) break;
    ++made;
  }
  printf("%d\n", made);
  return 0;
})";

}  // namespace

TEST(SandboxIsolation, NoNetworkInsideNamespaces) {
  REQUIRE_NAMESPACES();
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof a;
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string port = std::to_string(ntohs(a.sin_port));
  const std::string prog = build("connect", kConnect);
  eval::SandboxLimits l;
  const auto open_run = eval::Sandbox(eval::Isolation::kNone).run({prog, port}, fresh_dir(), l);
  EXPECT_EQ(open_run.exit_code, 0) << "control: the host's loopback must accept " << open_run.err;
  const auto closed = eval::Sandbox(eval::Isolation::kNamespaces).run({prog, port}, fresh_dir(), l);
  EXPECT_EQ(closed.exit_code, 3) << closed.out << closed.err;
  EXPECT_NE(closed.err.find("connect"), std::string::npos) << closed.err;
  close(listener);
}

TEST(SandboxIsolation, WritesOutsideItsDirectoryFail) {
  REQUIRE_NAMESPACES();
  const std::string prog = build("escape", kEscape);
  const std::string outside = "/tmp/slm-escape-" + std::to_string(getpid());
  eval::SandboxLimits l;
  const std::string dir = fresh_dir();
  const auto r = eval::Sandbox(eval::Isolation::kNamespaces).run({prog, outside}, dir, l);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(::access(outside.c_str(), F_OK), 0) << outside << " was written from inside the sandbox";
  EXPECT_EQ(::access((dir + "/inside.txt").c_str(), F_OK), 0) << "its own directory must stay writable";
  // Control: without namespaces the same program writes the file (so the check above can fail).
  const auto c = eval::Sandbox(eval::Isolation::kNone).run({prog, outside}, fresh_dir(), l);
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(::access(outside.c_str(), F_OK), 0);
  unlink(outside.c_str());
}

TEST(SandboxLimits, ForksAreCappedAndEveryProcessIsGoneAfterwards) {
  const std::string prog = build("forker", kForker);
  std::vector<eval::Isolation> modes = {eval::Isolation::kNone};
  if (eval::Sandbox::probe().empty()) modes.push_back(eval::Isolation::kNamespaces);
  for (auto mode : modes) {
    eval::SandboxLimits l;
    l.processes = 16;
    const auto r = eval::Sandbox(mode).run({prog}, fresh_dir(), l);
    ASSERT_EQ(r.exit_code, 0) << eval::isolation_name(mode) << ": " << r.err;
    const int made = std::stoi(r.out);
    EXPECT_LT(made, 16) << eval::isolation_name(mode) << ": RLIMIT_NPROC did not hold";
    EXPECT_GE(made, 1) << eval::isolation_name(mode);
    EXPECT_TRUE(group_gone(r.process_group)) << eval::isolation_name(mode) << ": its paused children survived";
  }
}

TEST(SandboxLimits, WallClockKillsTheGroupAndEscapedSessionsDieWithTheNamespace) {
  REQUIRE_NAMESPACES();
  eval::SandboxLimits l;
  l.wall_s = 1;
  // A child in a session of its own is outside the process group; only the PID namespace catches it. Its duration
  // carries this process's id, so that another run of this test at the same time (two ctest runs under load) is not
  // taken for a survivor of this one.
  const std::string marker = "31." + std::to_string(getpid());
  const auto r = eval::Sandbox(eval::Isolation::kNamespaces)
                     .run({"sh", "-c", "setsid sleep " + marker + " & sleep 30"}, fresh_dir(), l);
  // The cause is the wall clock (neither the CPU limit nor the output cap: sleep uses neither), and the run was
  // killed, not finished: the sleep would have taken 30 s. The time bound is only a safety deadline, far from the
  // 1 s limit (plus the 2 s kill escalation) so that a loaded machine never trips it.
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.cpu_exceeded);
  EXPECT_FALSE(r.output_exceeded);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_GE(r.seconds, 0.9) << "killed before its limit";  // the deadline is checked in whole milliseconds
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_TRUE(group_gone(r.process_group));
  // No process on the machine still runs the escaped sleep.
  DIR* proc = opendir("/proc");
  ASSERT_NE(proc, nullptr);
  int survivors = 0;
  while (dirent* e = readdir(proc)) {
    std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), {});
    if (cmd.find(marker + '\0') != std::string::npos && cmd.find("sh") != 0) ++survivors;  // whole argument
  }
  closedir(proc);
  EXPECT_EQ(survivors, 0);
}

TEST(SandboxLimits, MissingProgramIsAClearError) {
  eval::SandboxLimits l;
  try {
    eval::Sandbox(eval::Isolation::kNone).run({"slm-no-such-program"}, fresh_dir(), l);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slm-no-such-program: not found"), std::string::npos) << e.what();
  }
}
