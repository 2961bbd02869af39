#include "slm/ops/fused_kernels.h"

#include <atomic>

namespace slm::ops {

namespace {
std::atomic<bool> enabled{true};
}

bool fused_kernels_enabled() {
  return enabled.load(std::memory_order_relaxed);
}
void set_fused_kernels(bool on) {
  enabled.store(on, std::memory_order_relaxed);
}

}  // namespace slm::ops
