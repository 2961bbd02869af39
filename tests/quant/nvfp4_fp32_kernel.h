#pragma once
// For tests that compare an NVFP4 model part with its dense dequantized copy to FP32 summation-order error: while in
// scope, nvfp4::linear's CPU path runs a kernel that keeps x in FP32 (AVX2, or the portable one). The default kernel
// on AVX-512 BF16 CPUs rounds x to BF16 first; tests/quant/test_nvfp4_linear.cpp checks that one against its own
// reference.
#include "slm/quant/nvfp4_linear.h"

namespace slm::test {

inline nvfp4::CpuKernel fp32_nvfp4_kernel() {
  return nvfp4::cpu_kernel_available(nvfp4::CpuKernel::Avx2) ? nvfp4::CpuKernel::Avx2 : nvfp4::CpuKernel::Portable;
}

struct Fp32Nvfp4Kernel {
  Fp32Nvfp4Kernel() { nvfp4::set_cpu_kernel(fp32_nvfp4_kernel()); }
  ~Fp32Nvfp4Kernel() { nvfp4::set_cpu_kernel(nvfp4::CpuKernel::Auto); }
  Fp32Nvfp4Kernel(const Fp32Nvfp4Kernel&) = delete;
  Fp32Nvfp4Kernel& operator=(const Fp32Nvfp4Kernel&) = delete;
};

}  // namespace slm::test
