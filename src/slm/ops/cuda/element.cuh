#pragma once
// Loads, stores and rounding of one FP32/BF16/FP16 element, for the fused kernels that compute in FP32 and round to
// the tensor's dtype where the tensor ops they replace round (rotary_norm_kernel.cu, residual_mix_kernel.cu, ...).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

__device__ __forceinline__ float load(const float* p) {
  return *p;
}
__device__ __forceinline__ float load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ float load(const __half* p) {
  return __half2float(*p);
}

// v rounded to the dtype of the (unused) pointer's element type, back in FP32.
__device__ __forceinline__ float round_to(float v, const float*) {
  return v;
}
__device__ __forceinline__ float round_to(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16(v));
}
__device__ __forceinline__ float round_to(float v, const __half*) {
  return __half2float(__float2half(v));
}

__device__ __forceinline__ void store(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16(v);
}
__device__ __forceinline__ void store(__half* p, float v) {
  *p = __float2half(v);
}

// Host side: f(tag) with tag a null const T* for dtype's element type T (float, __nv_bfloat16 or __half), so that a
// launcher names its kernel template once instead of once per case of a switch.
template <class F>
auto with_element_type(DecodeDtype dtype, F&& f) {
  switch (dtype) {
    case DecodeDtype::kBFloat16: return f(static_cast<const __nv_bfloat16*>(nullptr));
    case DecodeDtype::kHalf: return f(static_cast<const __half*>(nullptr));
    case DecodeDtype::kFloat: break;
  }
  return f(static_cast<const float*>(nullptr));
}

// The element type behind such a tag.
template <class Tag>
using TagType = std::remove_const_t<std::remove_pointer_t<Tag>>;

// The current device's SM count, read once per device: the grid caps of the grid-stride kernels are a few waves of
// CTAs on whatever GPU runs them (132 SMs on an H100/H200 SXM, 114 on the PCIe H100).
inline int64_t multiprocessors() {
  static std::atomic<int> count[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  int n = count[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    count[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace slm::ops::cuda
