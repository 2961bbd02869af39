#pragma once
// The libtorch benchmarks' timer: the median wall time of repeated calls, after one warm-up call (allocator and
// kernel caches), synchronizing the GPU around each call when the work runs there.
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace slm::bench {

inline double median_ms(const std::function<void()>& fn, int reps, bool cuda = false) {
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  fn();
  sync();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace slm::bench
