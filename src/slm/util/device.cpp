#include "slm/util/device.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

#include "slm/util/error.h"

namespace slm {

c10::Device parse_device(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name != "cuda") throw Error("--device must be cpu or cuda (got '" + name + "')");
  if (!at::hasCUDA()) throw Error("--device cuda: this build's libtorch has no CUDA support");
  if (!torch::cuda::is_available()) throw Error("--device cuda: no CUDA device is visible on this machine");
  return c10::Device(c10::kCUDA, 0);
}

}  // namespace slm
