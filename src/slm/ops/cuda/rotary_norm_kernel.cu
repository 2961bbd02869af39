// The rotary embedding of one decode token and the per-head RMSNorm after it, one CTA per (row, head) and one
// thread per (real, imaginary) pair.
//
// Why: as tensor ops a decode step's rotation costs about ten kernels per tensor (two table lookups, four products,
// a sum, a difference, the concatenation, the norm): some twenty launches per attention layer for two [heads, 128]
// vectors, each a few microseconds of GPU time (bench/RESULTS.md). The rotation rounds to the tensor's dtype after
// every product and sum, as those ops do, so that it gives their values bit for bit; the norm reduces in FP32.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/rotary_norm_kernel.h"

namespace slm::ops::cuda {

namespace {

template <class T>
__global__ void rotary_norm_kernel(const T* __restrict__ x, T* __restrict__ out, const int64_t* __restrict__ positions,
                                   const T* __restrict__ cos, const T* __restrict__ sin, const T* __restrict__ weight,
                                   int heads, int half, float eps) {
  const int64_t vec = blockIdx.x;  // row * heads + head
  const int i = threadIdx.x;
  const int64_t at = positions[vec / heads] * half + i;
  const T* xv = x + vec * 2 * half;
  const float x1 = load(xv + i), x2 = load(xv + i + half), c = load(cos + at), s = load(sin + at);
  const T* tag = nullptr;  // picks the rounding of T
  // _rn: no contraction into FMAs, which would skip the product's rounding that the tensor ops do in FP32.
  float r1 = round_to(__fsub_rn(round_to(__fmul_rn(x1, c), tag), round_to(__fmul_rn(x2, s), tag)), tag);
  float r2 = round_to(__fadd_rn(round_to(__fmul_rn(x2, c), tag), round_to(__fmul_rn(x1, s), tag)), tag);
  if (weight) {
    // A tree over the pairs in shared memory: any pair count, and the same order of sums on every call.
    __shared__ float partial[512];
    partial[i] = r1 * r1 + r2 * r2;
    __syncthreads();
    for (int stride = 256; stride > 0; stride >>= 1) {
      if (i < stride && i + stride < half) partial[i] += partial[i + stride];
      __syncthreads();
    }
    const float ss = partial[0];
    const float inv = rsqrtf(ss / static_cast<float>(2 * half) + eps);
    r1 = r1 * inv * load(weight + i);
    r2 = r2 * inv * load(weight + i + half);
  }
  T* ov = out + vec * 2 * half;
  store(ov + i, r1);
  store(ov + i + half, r2);
}

template <class T>
std::string launch(const void* x, void* out, const int64_t* positions, const void* cos, const void* sin,
                   const void* weight, int64_t rows, int64_t heads, int64_t half, float eps, cudaStream_t stream) {
  rotary_norm_kernel<T><<<static_cast<unsigned>(rows * heads), static_cast<unsigned>(half), 0, stream>>>(
      static_cast<const T*>(x), static_cast<T*>(out), positions, static_cast<const T*>(cos), static_cast<const T*>(sin),
      static_cast<const T*>(weight), static_cast<int>(heads), static_cast<int>(half), eps);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("rotary norm kernel: ") + cudaGetErrorString(e);
}

}  // namespace

std::string rotary_norm(DecodeDtype dtype, const void* x, void* out, const int64_t* positions, const void* cos,
                        const void* sin, const void* weight, int64_t rows, int64_t heads, int64_t half, float eps,
                        void* stream) {
  if (rows * heads == 0) return "";
  if (half < 1 || half > 512) return "rotary norm kernel: " + std::to_string(half) + " pairs per head (1..512)";
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DecodeDtype::kFloat: return launch<float>(x, out, positions, cos, sin, weight, rows, heads, half, eps, s);
    case DecodeDtype::kBFloat16:
      return launch<__nv_bfloat16>(x, out, positions, cos, sin, weight, rows, heads, half, eps, s);
    case DecodeDtype::kHalf: return launch<__half>(x, out, positions, cos, sin, weight, rows, heads, half, eps, s);
  }
  return "rotary norm kernel: unknown dtype";
}

}  // namespace slm::ops::cuda
