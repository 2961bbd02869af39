#pragma once
// A profile of a stretch of work through libtorch's Kineto profiler: where the GPU time goes (kernels by total
// time), how many kernels a step launches and how much of the wall time the GPU sits idle waiting for the host.
// `slm train --profile-steps N` and the benchmarks use it; bench/RESULTS.md keeps the summaries.
#include <cstdint>
#include <string>
#include <vector>

namespace slm::train {

struct KernelTime {
  std::string name;
  int64_t calls = 0;
  double total_ms = 0;
};

struct ProfileSummary {
  int64_t steps = 1;
  double wall_ms = 0;           // the profiled stretch, synchronized at both ends
  bool gpu = false;             // GPU activities were recorded (else: CPU operators)
  double busy_ms = 0;           // union of the GPU activities' intervals (GPU) or 0
  int64_t launches = 0;         // GPU activities (kernels, copies, sets), or CPU operator calls
  std::vector<KernelTime> top;  // by total time, longest first
  // A readable table: per-step wall, busy, idle and launches, then the top entries.
  std::string text(size_t rows = 15) const;
};

// Records everything between start() and stop(). One Profiler at a time in a process (Kineto is global).
class Profiler {
 public:
  // cuda: also record GPU activities (the device must exist).
  void start(bool cuda);
  // Stops, writes the Chrome trace to trace_path unless it is empty, and summarises `steps` steps.
  ProfileSummary stop(int64_t steps, const std::string& trace_path = "");
  bool running() const { return running_; }

 private:
  bool cuda_ = false, running_ = false;
  double t0_ms_ = 0;
};

// Kernel names are long C++ template instantiations; this keeps the part a reader recognises.
std::string short_kernel_name(const std::string& name, size_t max_len = 90);

}  // namespace slm::train
