#pragma once
// `slm train --nproc N`: one worker process per device on this machine, each told its place the way torchrun
// does it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so an external launcher
// can start the same workers on several machines instead.
#include <string>
#include <vector>

namespace slm::train {

// This process's command line (from /proc/self/cmdline) without its "--nproc N" / "--nproc=N".
std::vector<std::string> command_line_without_nproc();

// Runs `/proc/self/exe args[1:]` nproc times with the environment above (MASTER_PORT: the caller's, else a free
// local port) and waits. SIGINT/SIGTERM are forwarded once to every worker (each saves a checkpoint and stops);
// when one worker fails the others get SIGTERM, then SIGKILL after grace_s. Returns 0 when all succeeded, else
// the first failure's status (exit code, or 128 + signal), or 128 + the signal the launcher received.
int launch_workers(int nproc, const std::vector<std::string>& args, double grace_s = 30);

}  // namespace slm::train
