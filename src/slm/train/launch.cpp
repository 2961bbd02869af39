#include "slm/train/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "slm/util/error.h"

namespace slm::train {

namespace {

std::atomic<int> g_launcher_signal{0};

extern "C" void on_launcher_signal(int sig) {
  g_launcher_signal = sig;
}

// A port nobody listens on now (the kernel's choice); rank 0 binds it moments later.
int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(std::string("launcher: socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw Error(std::string("launcher: cannot find a free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

std::vector<std::string> command_line_without_nproc() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t b = 0; b < raw.size();) {
    const size_t e = raw.find('\0', b);
    args.push_back(raw.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  if (out.empty()) throw Error("launcher: cannot read this process's command line from /proc/self/cmdline");
  return out;
}

int launch_workers(int nproc, const std::vector<std::string>& args, double grace_s) {
  if (nproc < 1) throw Error("--nproc must be >= 1 (got " + std::to_string(nproc) + ")");
  const char* port_env = std::getenv("MASTER_PORT");
  const std::string port = port_env != nullptr && *port_env != '\0' ? port_env : std::to_string(free_local_port());
  const char* addr_env = std::getenv("MASTER_ADDR");
  const std::string addr = addr_env != nullptr && *addr_env != '\0' ? addr_env : "127.0.0.1";

  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  g_launcher_signal = 0;

  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("launcher: fork: ") + std::strerror(errno));
    if (pid == 0) {
      // Its own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it once.
      ::setpgid(0, 0);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", addr.c_str(), 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      // As torchrun: workers share the cores, so each gets its part for intra-op threads unless told otherwise.
      if (std::getenv("OMP_NUM_THREADS") == nullptr)
        ::setenv(
            "OMP_NUM_THREADS",
            std::to_string(std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(nproc))).c_str(),
            1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "slm: launcher: cannot start worker %d: %s\n", r, std::strerror(errno));
      ::_exit(127);
    }
    pids.push_back(pid);
  }

  using Clock = std::chrono::steady_clock;
  int first_failure = 0, forwarded = 0;
  Clock::time_point kill_at = Clock::time_point::max();
  size_t running = pids.size();
  auto signal_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  while (running > 0) {
    if (const int sig = g_launcher_signal.load(); sig != 0 && forwarded == 0) {
      forwarded = sig;
      signal_all(sig);
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (auto& p : pids)
        if (p == done) {
          p = -1;
          --running;
          const int code = status_code(status);
          if (code != 0 && first_failure == 0) {
            first_failure = code;
            if (running > 0) {
              std::fprintf(stderr, "slm: launcher: a worker failed (status %d); stopping the others\n", code);
              signal_all(SIGTERM);
              kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
            }
          }
        }
      continue;
    }
    if (Clock::now() > kill_at) {
      signal_all(SIGKILL);
      kill_at = Clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (first_failure != 0) return first_failure;
  return forwarded != 0 ? 128 + forwarded : 0;
}

}  // namespace slm::train
