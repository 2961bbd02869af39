#pragma once
// Running untrusted programs (model completions and the compiler that builds them) with limits.
//
// Namespaces isolation (the default where the kernel permits unprivileged user namespaces; probed at start): the
// program runs in new user, network, PID, mount, IPC and UTS namespaces. It has no network (only a down loopback
// device), sees none of the host's processes, and every process it starts dies with the namespace when its init
// (a small reaper, the sandbox's first process) exits. Its user is unprivileged on the host (nobody, 65534, when
// the harness runs as root; otherwise the harness's own user), and the whole file system is read-only except its
// working directory. None isolation (the fallback, with a warning): a process group and the limits only; the program
// can reach the network and write wherever its user may (nobody when the harness runs as root), and a process that
// leaves the group survives the kill. (The harness becomes a child subreaper, to reap what the program leaves.)
//
// Both modes set in the program's process: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC (counted per sandbox
// in a user namespace; per user, across the host, otherwise) and no core files; a wall-clock deadline kills the
// whole process group, and stdout/stderr are captured up to a cap (past it the program is killed).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "slm/util/process.h"

namespace slm::eval {

enum class Isolation { kNamespaces, kNone };
const char* isolation_name(Isolation isolation);  // "namespaces" / "none"

struct SandboxLimits {
  double wall_s = 10;                  // then SIGKILL to the process group
  int cpu_s = 10;                      // RLIMIT_CPU (SIGXCPU at the limit, SIGKILL a second later)
  uint64_t memory_bytes = 1ull << 30;  // RLIMIT_AS
  uint64_t file_bytes = 64ull << 20;   // RLIMIT_FSIZE: the largest file it may write (compilers write binaries)
  int processes = 32;                  // RLIMIT_NPROC
  size_t output_bytes = 1 << 20;       // stdout and stderr, each; more kills the program
};

struct SandboxResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;        // the wall clock ran out
  bool cpu_exceeded = false;     // RLIMIT_CPU ended it
  bool output_exceeded = false;  // stdout or stderr passed the cap (then it was killed)
  double seconds = 0;            // wall time
  int process_group = 0;         // the sandbox's process group (gone when run() returns)
  std::string out, err;
  bool ok() const { return exit_code == 0 && !timed_out && !output_exceeded; }
};

class Sandbox {
 public:
  // Isolation::kNamespaces throws slm::Error when this machine refuses it (probe() says whether it works).
  explicit Sandbox(Isolation isolation);

  // Tries kNamespaces by running `true` inside it: "" when it works, else why not (the step and the errno).
  static std::string probe();

  Isolation isolation() const { return isolation_; }

  // Runs argv (argv[0] is looked up on PATH) in dir with a small fixed environment (PATH, HOME=dir, TMPDIR=dir,
  // LC_ALL=C). dir must be a directory this call may hand to the sandbox's user (it is chowned to it when the
  // harness runs as root); its parents must be searchable by that user. Throws slm::Error when the program is not
  // found or the sandbox cannot be set up.
  SandboxResult run(const std::vector<std::string>& argv, const std::string& dir, const SandboxLimits& limits) const;

 private:
  Isolation isolation_;
};

}  // namespace slm::eval
