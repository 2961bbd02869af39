#include "slm/ops/fused_kernels.h"

#include <atomic>

#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

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

void check_launch(const std::string& error) {
  if (!error.empty()) throw Error(error);
}

#ifdef SLM_WITH_CUDA
void* current_stream(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}
#endif

}  // namespace slm::ops
