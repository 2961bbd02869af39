#include "slm/train/profile.h"

#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "slm/util/error.h"

namespace slm::train {

namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Work done on the device: kernels, copies and sets (not the annotations that span them).
bool device_work(uint8_t activity) {
  const auto a = static_cast<libkineto::ActivityType>(activity);
  return a == libkineto::ActivityType::CONCURRENT_KERNEL || a == libkineto::ActivityType::GPU_MEMCPY ||
         a == libkineto::ActivityType::GPU_MEMSET;
}

}  // namespace

std::string short_kernel_name(const std::string& name, size_t max_len) {
  // "void ns::kernel<...>(args)" -> "ns::kernel<...>": drop the return type and the parameter list.
  std::string s = name;
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s.compare(i, 21, "(anonymous namespace)") == 0) {
      i += 20;
      continue;
    }
    if (s[i] == '(' && depth == 0 && i > 0) {
      s.resize(i);
      break;
    }
  }
  if (s.size() > max_len) s = s.substr(0, max_len - 3) + "...";
  return s;
}

void Profiler::start(bool cuda) {
  if (running_) throw Error("profiler: already running");
  cuda_ = cuda;
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);  // shapes name the ops in the trace
  prof::prepareProfiler(config, activities);
  if (cuda) torch::cuda::synchronize();
  prof::enableProfiler(config, activities);
  t0_ms_ = now_ms();
  running_ = true;
}

ProfileSummary Profiler::stop(int64_t steps, const std::string& trace_path) {
  if (!running_) throw Error("profiler: stop without start");
  if (cuda_) torch::cuda::synchronize();
  ProfileSummary s;
  s.wall_ms = now_ms() - t0_ms_;
  running_ = false;
  auto result = prof::disableProfiler();
  s.steps = std::max<int64_t>(1, steps);
  s.gpu = cuda_;
  std::map<std::string, KernelTime> by_name;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const auto& e : result->events()) {
    const bool on_device = e.deviceType() == c10::DeviceType::CUDA && device_work(e.activityType());
    if (cuda_ ? !on_device : e.deviceType() != c10::DeviceType::CPU) continue;
    auto& k = by_name[e.name()];
    k.name = e.name();
    ++k.calls;
    k.total_ms += static_cast<double>(e.durationNs()) / 1e6;
    ++s.launches;
    if (on_device) intervals.emplace_back(e.startNs(), e.endNs());
  }
  std::sort(intervals.begin(), intervals.end());
  uint64_t busy = 0, open_start = 0, open_end = 0;
  for (const auto& [a, b] : intervals) {
    if (a > open_end) {
      busy += open_end - open_start;
      open_start = a;
      open_end = b;
    } else {
      open_end = std::max(open_end, b);
    }
  }
  busy += open_end - open_start;
  s.busy_ms = static_cast<double>(busy) / 1e6;
  for (auto& [name, k] : by_name) s.top.push_back(std::move(k));
  std::sort(s.top.begin(), s.top.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.total_ms > b.total_ms; });
  if (!trace_path.empty()) result->save(trace_path);
  return s;
}

std::string ProfileSummary::text(size_t rows) const {
  std::ostringstream o;
  const double n = static_cast<double>(steps);
  char line[512];
  if (gpu) {
    std::snprintf(line, sizeof line,
                  "profile of %lld step(s): wall %.2f ms/step, GPU busy %.2f ms/step (%.1f%%), GPU idle %.2f ms/step, "
                  "%.0f GPU activities/step\n",
                  static_cast<long long>(steps), wall_ms / n, busy_ms / n, 100.0 * busy_ms / std::max(wall_ms, 1e-9),
                  (wall_ms - busy_ms) / n, static_cast<double>(launches) / n);
  } else {
    std::snprintf(line, sizeof line, "profile of %lld step(s): wall %.2f ms/step, %.0f CPU operator calls/step\n",
                  static_cast<long long>(steps), wall_ms / n, static_cast<double>(launches) / n);
  }
  o << line;
  std::snprintf(line, sizeof line, "%10s %7s %10s  %s\n", "ms/step", gpu ? "of busy" : "of wall", "calls/step",
                gpu ? "GPU kernel" : "CPU operator (inclusive)");
  o << line;
  const double base = gpu ? busy_ms : wall_ms;
  for (size_t i = 0; i < top.size() && i < rows; ++i) {
    std::snprintf(line, sizeof line, "%10.3f %6.1f%% %10.1f  %s\n", top[i].total_ms / n,
                  100.0 * top[i].total_ms / std::max(base, 1e-9), static_cast<double>(top[i].calls) / n,
                  short_kernel_name(top[i].name).c_str());
    o << line;
  }
  return o.str();
}

}  // namespace slm::train
