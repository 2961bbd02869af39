#pragma once
// Running external tools (compilers, sanitized programs, gdb, clang-tidy, man) for the generated corpora:
// argv is executed directly (no shell), output is captured, and a wall-clock limit kills the whole process group.
#include <string>
#include <vector>

namespace slm {

struct ProcessOptions {
  std::string cwd;               // "" = the caller's
  std::vector<std::string> env;  // extra NAME=VALUE entries on top of the caller's environment
  double timeout_s = 60;         // then SIGKILL to the process group
  bool merge_stderr = false;     // stderr into `out` (interleaved as the tool wrote it)
  bool no_aslr = false;          // personality(ADDR_NO_RANDOMIZE): reproducible addresses in sanitizer reports
  size_t max_output = 4 << 20;   // bytes kept per stream (the rest is read and dropped)
  bool kill_at_max_output = false;  // SIGKILL the process group once a stream passes max_output (untrusted programs)
};

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  bool output_truncated = false;  // a stream passed max_output
  int pid = 0;
  std::string out, err;
  bool ok() const { return exit_code == 0 && !timed_out; }
};

// Throws slm::Error when the program cannot be started (not on PATH, not executable).
ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

// The capture half of run_process, for callers that start the child themselves (the evaluation sandbox): pid leads
// its own process group; out_fd and err_fd (-1 when stderr is merged) are the read ends of its pipes, closed here.
// Reads until the pipes close, kills the group at the deadline (options.timeout_s) or, with kill_at_max_output, at
// the output cap, and reaps pid.
ProcessResult collect_process(int pid, int out_fd, int err_fd, const ProcessOptions& options);

// The path execve needs for `name` (searched on PATH unless it holds a '/'); "" when there is no such executable.
std::string find_program(const std::string& name);

// Is `name` an executable on PATH (or an executable path)?
bool program_available(const std::string& name);

}  // namespace slm
