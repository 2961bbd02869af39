#pragma once
// The device helpers every kernel file shares (as llm.c keeps them in one cuda_utils.cuh): loads, stores,
// conversions and rounding of one FP32/BF16/FP16 element, for the fused kernels that compute in FP32 and round to the
// tensor's dtype where the tensor ops they replace round; warp reductions; the launchers' dtype dispatch and SM count.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

constexpr unsigned kFullMask = 0xffffffffu;  // every lane of a warp, for the __shfl_*_sync intrinsics

// The sum of v over the warp by a butterfly: every lane ends with the same sum, in the same order on every call.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// By value, for elements already in registers (a packed vector's): to FP32, and from FP32 rounded to nearest even.
__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half(x);
}

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
