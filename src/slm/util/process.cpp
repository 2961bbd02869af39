#include "slm/util/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/personality.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "slm/util/error.h"

extern char** environ;

namespace slm {

namespace {

std::vector<std::string> merged_environment(const std::vector<std::string>& extra) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    vars[kv.substr(0, kv.find('='))] = kv;
  }
  for (const auto& kv : extra) vars[kv.substr(0, kv.find('='))] = kv;
  std::vector<std::string> out;
  for (auto& [k, kv] : vars) out.push_back(std::move(kv));
  return out;
}

}  // namespace

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    const std::string cand = p.substr(start, end - start) + "/" + name;
    struct stat st;
    if (end > start && stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(cand.c_str(), X_OK) == 0)
      return cand;
    start = end + 1;
  }
  return "";
}

bool program_available(const std::string& name) { return !find_program(name).empty(); }

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& o) {
  if (argv.empty()) throw Error("run_process: empty command");
  // Everything the child needs is built before fork: between fork and exec only async-signal-safe calls are
  // allowed (the corpus generators run several tools from worker threads).
  std::vector<std::string> env = merged_environment(o.env);
  std::vector<char*> envp, args;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);

  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC) || pipe2(exec_pipe, O_CLOEXEC))
    throw Error("run_process: pipe: " + std::string(std::strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) throw Error("run_process: fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_pipe[1], 1);
    dup2(o.merge_stderr ? out_pipe[1] : err_pipe[1], 2);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    if (o.no_aslr) personality(ADDR_NO_RANDOMIZE);
    int err = 0;
    if (!o.cwd.empty() && chdir(o.cwd.c_str()) != 0) err = errno;
    if (!err) {
      execvpe(args[0], args.data(), envp.data());
      err = errno;
    }
    (void)!write(exec_pipe[1], &err, sizeof err);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  int exec_errno = 0;
  const bool exec_failed = read(exec_pipe[0], &exec_errno, sizeof exec_errno) == sizeof exec_errno;
  close(exec_pipe[0]);

  if (exec_failed) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw Error(argv[0] + ": cannot run (" + std::strerror(exec_errno) + ")");
  }
  if (o.merge_stderr) close(err_pipe[0]);  // never written: stderr went to out_pipe
  return collect_process(pid, out_pipe[0], o.merge_stderr ? -1 : err_pipe[0], o);
}

ProcessResult collect_process(int pid, int out_fd, int err_fd, const ProcessOptions& o) {
  ProcessResult r;
  r.pid = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = (out_fd >= 0) + (err_fd >= 0);
  bool killed = false;
  char buf[65536];
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = killed = true;
      kill(-pid, SIGKILL);
      break;
    }
    const int n = poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      const size_t room = o.max_output - std::min(o.max_output, sinks[i]->size());
      sinks[i]->append(buf, std::min(static_cast<size_t>(got), room));
      if (static_cast<size_t>(got) > room) r.output_truncated = true;
    }
    if (r.output_truncated && o.kill_at_max_output) {
      killed = true;
      kill(-pid, SIGKILL);
      break;
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Grandchildren that kept the pipes open are gone with the group.
  if (killed) kill(-pid, SIGKILL);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

}  // namespace slm
