#include "slm/util/device.h"

#include <ATen/cpu/Utils.h>
#include <torch/cuda.h>

#include "slm/util/error.h"

namespace slm {

c10::Device parse_device(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name != "cuda") throw Error("--device must be cpu or cuda (got '" + name + "')");
  // libtorch answers the same "no" for a build without CUDA and for a machine without a GPU or driver.
  if (!torch::cuda::is_available())
    throw Error("--device cuda: no CUDA device is available (a libtorch without CUDA, or no GPU or driver here)");
  return c10::Device(c10::kCUDA, 0);
}

bool native_bf16_matmul(c10::Device device) {
  if (device.is_cuda()) return true;
  if (!device.is_cpu()) return false;
  static const bool amx = [] {
    const auto caps = at::cpu::get_cpu_capabilities();
    const auto it = caps.find("amx_bf16");
    return it != caps.end() && it->second.isBool() && it->second.toBool();
  }();
  return amx;
}

}  // namespace slm
