#include "slm/eval/sandbox.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "slm/util/error.h"

namespace slm::eval {

namespace {

constexpr uid_t kNobody = 65534;

// The steps of the sandbox's processes; a failing one reports {step, errno} on the report pipe.
enum Step : int {
  kSync,
  kMountPrivate,
  kBindDir,
  kReadOnly,
  kWritableDir,
  kChdir,
  kGroups,
  kGid,
  kUid,
  kFork,
  kLimits,
  kExec
};
const char* step_name(int s) {
  static const char* names[] = {"waiting for the id maps",
                                "making mounts private",
                                "bind-mounting the directory",
                                "making the file system read-only",
                                "keeping the directory writable",
                                "chdir",
                                "dropping supplementary groups",
                                "setresgid",
                                "setresuid",
                                "fork",
                                "setrlimit",
                                "exec"};
  return s >= 0 && s <= kExec ? names[s] : "?";
}

struct Report {
  int step;
  int err;
};

// Everything the children need, prepared before the clone: between it and exec they make system calls only (the
// harness is multithreaded, and a raw clone copies no glibc state that is safe to use).
struct Plan {
  bool namespaces = false;
  bool drop = false;  // switch to uid/gid below (an unprivileged user; in a user namespace this drops capabilities)
  uid_t uid = 0;
  gid_t gid = 0;
  const char* dir = nullptr;
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  SandboxLimits limits;
  int out_w = -1, err_w = -1, report_w = -1, status_w = -1, sync_r = -1;
};

long raw_fork(unsigned long flags) {
  return syscall(SYS_clone, flags | SIGCHLD, nullptr, nullptr, nullptr, 0);
}

[[noreturn]] void fail(const Plan& p, int step) {
  const Report r{step, errno};
  (void)!write(p.report_w, &r, sizeof r);
  _exit(127);
}

// Closes every descriptor but 0-2 and the ones the sandbox uses: the harness's other threads may hold pipes of other
// sandboxes, whose readers must see them close when their own program ends, not when this one does.
void close_other_fds(const Plan& p) {
  int keep[] = {p.report_w, p.status_w, p.sync_r};
  std::sort(std::begin(keep), std::end(keep));
  unsigned lo = 3;
  for (int k : keep) {
    if (k < 0) continue;
    if (static_cast<unsigned>(k) > lo) syscall(SYS_close_range, lo, static_cast<unsigned>(k) - 1, 0);
    lo = static_cast<unsigned>(k) + 1;
  }
  syscall(SYS_close_range, lo, ~0u, 0);
}

void set_limit(const Plan& p, int resource, rlim_t soft, rlim_t hard) {
  const rlimit l{soft, hard};
  if (setrlimit(resource, &l) != 0) fail(p, kLimits);
}

// The program's process: limits, then exec.
[[noreturn]] void program(const Plan& p) {
  const auto& l = p.limits;
  set_limit(p, RLIMIT_CPU, static_cast<rlim_t>(l.cpu_s), static_cast<rlim_t>(l.cpu_s) + 1);
  set_limit(p, RLIMIT_AS, l.memory_bytes, l.memory_bytes);
  set_limit(p, RLIMIT_FSIZE, l.file_bytes, l.file_bytes);
  set_limit(p, RLIMIT_NPROC, static_cast<rlim_t>(l.processes), static_cast<rlim_t>(l.processes));
  set_limit(p, RLIMIT_CORE, 0, 0);
  execve(p.path, p.argv, p.envp);
  fail(p, kExec);
}

// The sandbox's first process: in namespaces mode the init of the PID namespace, so every process the program
// leaves behind dies when it exits. Sets up the file system and the user, starts the program, reports its status.
[[noreturn]] void sandbox_init(const Plan& p) {
  setpgid(0, 0);
  dup2(p.out_w, 1);
  dup2(p.err_w, 2);
  const int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  close_other_fds(p);
  if (p.namespaces) {
    char go = 0;
    if (read(p.sync_r, &go, 1) != 1) fail(p, kSync);  // the harness writes our uid/gid maps first
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) fail(p, kMountPrivate);
    if (mount(p.dir, p.dir, nullptr, MS_BIND | MS_REC, nullptr) != 0) fail(p, kBindDir);
    mount_attr ro{};
    ro.attr_set = MOUNT_ATTR_RDONLY;
    if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &ro, sizeof ro) != 0) fail(p, kReadOnly);
    mount_attr rw{};
    rw.attr_clr = MOUNT_ATTR_RDONLY;
    if (syscall(SYS_mount_setattr, AT_FDCWD, p.dir, AT_RECURSIVE, &rw, sizeof rw) != 0) fail(p, kWritableDir);
  }
  if (chdir(p.dir) != 0) fail(p, kChdir);
  if (p.drop) {
    // Refused (EPERM) in a user namespace whose setgroups is denied: then the groups are the user's own already.
    if (syscall(SYS_setgroups, 0, nullptr) != 0 && errno != EPERM) fail(p, kGroups);
    if (syscall(SYS_setresgid, p.gid, p.gid, p.gid) != 0) fail(p, kGid);
    if (syscall(SYS_setresuid, p.uid, p.uid, p.uid) != 0) fail(p, kUid);
  }
  const long child = raw_fork(0);
  if (child < 0) fail(p, kFork);
  if (child == 0) program(p);
  close(p.report_w);
  int status = 0;
  while (waitpid(static_cast<pid_t>(child), &status, 0) < 0 && errno == EINTR) {
  }
  (void)!write(p.status_w, &status, sizeof status);
  // Whatever the program left in the group goes with it. In namespaces mode the namespace's end kills every process
  // in it (also those in other groups) before this init is reaped; in none mode the harness reaps them.
  kill(0, SIGKILL);
  _exit(0);
}

void write_proc(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.flush();
  if (!f) throw Error("sandbox: cannot write " + path + " (" + std::strerror(errno) + ")");
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("sandbox: pipe: ") + std::strerror(errno));
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    close_r();
    close_w();
  }
  void close_r() {
    if (r >= 0) close(r);
    r = -1;
  }
  void close_w() {
    if (w >= 0) close(w);
    w = -1;
  }
};

}  // namespace

const char* isolation_name(Isolation i) {
  return i == Isolation::kNamespaces ? "namespaces" : "none";
}

Sandbox::Sandbox(Isolation isolation) : isolation_(isolation) {
  if (isolation == Isolation::kNamespaces)
    if (auto why = probe(); !why.empty()) throw Error("sandbox: namespaces are not available here: " + why);
}

std::string Sandbox::probe() {
  char tmpl[] = "/tmp/slm-sandbox-probe-XXXXXX";
  if (!mkdtemp(tmpl)) return std::string("mkdtemp: ") + std::strerror(errno);
  const std::string dir = tmpl;
  std::string why;
  try {
    Sandbox s(Isolation::kNone);
    s.isolation_ = Isolation::kNamespaces;  // without the constructor's probe
    SandboxLimits l;
    l.wall_s = 10;
    const auto r = s.run({"true"}, dir, l);
    if (!r.ok()) why = "a test program failed in the sandbox (" + r.err + ")";
  } catch (const Error& e) {
    why = e.what();
  }
  rmdir(dir.c_str());
  return why;
}

SandboxResult Sandbox::run(const std::vector<std::string>& argv, const std::string& dir,
                           const SandboxLimits& limits) const {
  if (argv.empty()) throw Error("sandbox: empty command");
  const std::string path = find_program(argv[0]);
  if (path.empty()) throw Error(argv[0] + ": not found on PATH");
  const bool root = geteuid() == 0;
  Plan p;
  p.namespaces = isolation_ == Isolation::kNamespaces;
  p.drop = p.namespaces || root;
  p.uid = root ? kNobody : getuid();
  p.gid = root ? kNobody : getgid();
  if (root && chown(dir.c_str(), p.uid, p.gid) != 0) throw Error("sandbox: chown " + dir + ": " + std::strerror(errno));
  const char* env_path = std::getenv("PATH");
  std::vector<std::string> env = {"PATH=" + std::string(env_path ? env_path : "/usr/bin:/bin"), "HOME=" + dir,
                                  "TMPDIR=" + dir, "LC_ALL=C"};
  std::vector<std::string> args = argv;
  std::vector<char*> argv_c, env_c;
  for (auto& a : args) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  for (auto& e : env) env_c.push_back(e.data());
  env_c.push_back(nullptr);
  p.dir = dir.c_str();
  p.path = path.c_str();
  p.argv = argv_c.data();
  p.envp = env_c.data();
  p.limits = limits;
  Pipe out, err, report, status, sync;
  p.out_w = out.w;
  p.err_w = err.w;
  p.report_w = report.w;
  p.status_w = status.w;
  p.sync_r = sync.r;

  // In none mode the program's orphans are reparented to the nearest subreaper: this process, so that it can reap
  // them below (an init that reaps slowly would otherwise keep them as zombies).
  if (!p.namespaces) prctl(PR_SET_CHILD_SUBREAPER, 1);
  const auto start = std::chrono::steady_clock::now();
  const unsigned long flags =
      p.namespaces ? CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS : 0;
  const long pid = raw_fork(flags);
  if (pid < 0) throw Error(std::string("sandbox: clone: ") + std::strerror(errno));
  if (pid == 0) sandbox_init(p);
  out.close_w();
  err.close_w();
  report.close_w();
  status.close_w();
  sync.close_r();
  setpgid(static_cast<pid_t>(pid), static_cast<pid_t>(pid));  // before any kill(-pid): the child may not have run yet
  auto abandon = [&](const std::string& why) {
    kill(static_cast<pid_t>(pid), SIGKILL);
    while (waitpid(static_cast<pid_t>(pid), nullptr, 0) < 0 && errno == EINTR) {
    }
    throw Error("sandbox: " + why);
  };
  if (p.namespaces) {
    // The sandbox's user is p.uid inside and out. A privileged harness may keep setgroups (the init drops the
    // supplementary groups itself); an unprivileged one must deny it before it may write gid_map.
    const std::string proc = "/proc/" + std::to_string(pid) + "/";
    try {
      if (!root) write_proc(proc + "setgroups", "deny");
      write_proc(proc + "uid_map", std::to_string(p.uid) + " " + std::to_string(p.uid) + " 1\n");
      write_proc(proc + "gid_map", std::to_string(p.gid) + " " + std::to_string(p.gid) + " 1\n");
    } catch (const Error& e) {
      abandon(e.what());
    }
    if (write(sync.w, "g", 1) != 1) abandon(std::string("sync: ") + std::strerror(errno));
  }
  sync.close_w();
  Report failure{};
  if (read(report.r, &failure, sizeof failure) == sizeof failure)
    abandon(std::string(step_name(failure.step)) + ": " + std::strerror(failure.err));

  ProcessOptions o;
  o.timeout_s = limits.wall_s;
  o.max_output = limits.output_bytes;
  o.kill_at_max_output = true;
  const int out_r = out.r, err_r = err.r;
  out.r = err.r = -1;  // collect_process closes them
  const ProcessResult pr = collect_process(static_cast<int>(pid), out_r, err_r, o);
  if (!p.namespaces) {
    // The init killed its group when the program ended; reap those that came to us (ECHILD: none left).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (pid_t w; (w = waitpid(-static_cast<pid_t>(pid), nullptr, WNOHANG)) >= 0;) {
      if (w > 0) continue;
      if (std::chrono::steady_clock::now() > until) break;
      kill(-static_cast<pid_t>(pid), SIGKILL);
      usleep(2000);
    }
  }
  SandboxResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.process_group = static_cast<int>(pid);
  r.out = pr.out;
  r.err = pr.err;
  r.timed_out = pr.timed_out;
  r.output_exceeded = pr.output_truncated;
  int program_status = 0;
  if (read(status.r, &program_status, sizeof program_status) == sizeof program_status) {
    if (WIFEXITED(program_status)) r.exit_code = WEXITSTATUS(program_status);
    if (WIFSIGNALED(program_status)) r.signal = WTERMSIG(program_status);
    r.cpu_exceeded = r.signal == SIGXCPU;
  }
  return r;
}

}  // namespace slm::eval
