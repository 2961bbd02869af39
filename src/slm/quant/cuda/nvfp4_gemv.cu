// Weight-only NVFP4 GEMV for decode batches (M = 1..16 per launch) on sm_90: NVFP4 weights, BF16 activations,
// FP32 accumulation. Hopper has no FP4 tensor cores, and at these batch sizes the product is bound by weight
// bytes, so the kernel streams the 4.5-bit weights once with wide loads and does the arithmetic on CUDA cores.
//
// One warp per output row n. Each lane loads VEC bytes of codes (VEC/8 blocks of 16 elements) per step, turns
// every byte into a half2 with a bit trick and multiplies against the matching BF16 activations of all M rows.
//
// Bit trick: an E2M1 code s e1 e0 m placed as FP16 bits s<<15 | e1 e0 m << 9 (exponent field e1 e0, top mantissa
// bit m) is exactly the E2M1 value times 2^-14, subnormal codes included; the 2^14 is folded into the block scale.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "slm/quant/cuda/nvfp4_gemv.h"

namespace slm::nvfp4::cuda {

namespace {

constexpr int kWarps = 8;  // warps (output rows) per CTA

__device__ __forceinline__ float e4m3_to_float(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xF, man = b & 0x7;
  // Block scales are non-negative and never NaN (validated on load).
  if (exp == 0) return static_cast<float>(man) * 0.001953125f;
  return __uint_as_float(((exp + 120u) << 23) | (man << 20));
}

// Two codes (one byte) -> two floats, times 2^-14.
__device__ __forceinline__ float2 byte_to_float2(uint32_t b) {
  const uint32_t bits = ((b & 0x7u) << 9) | ((b & 0x8u) << 12) | ((b & 0x70u) << 21) | ((b & 0x80u) << 24);
  __half2 h;
  static_assert(sizeof(h) == sizeof(bits));
  memcpy(&h, &bits, sizeof bits);
  return __half22float2(h);
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

// One block of 16 codes (two 32-bit words) against 16 activations of each of the M rows.
template <int M>
__device__ __forceinline__ void block_fma(uint32_t w0, uint32_t w1, float scale, const __nv_bfloat16* __restrict__ x,
                                          int64_t ldx, int64_t k0, float (&acc)[M]) {
  float w[16];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 a = byte_to_float2((w0 >> (8 * j)) & 0xFFu);
    float2 c = byte_to_float2((w1 >> (8 * j)) & 0xFFu);
    w[2 * j] = a.x;
    w[2 * j + 1] = a.y;
    w[8 + 2 * j] = c.x;
    w[8 + 2 * j + 1] = c.y;
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const uint4* xp = reinterpret_cast<const uint4*>(x + m * ldx + k0);
    const uint4 v0 = __ldg(xp), v1 = __ldg(xp + 1);
    const uint32_t xv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      d = fmaf(w[2 * i], bf16_lo(xv[i]), d);
      d = fmaf(w[2 * i + 1], bf16_hi(xv[i]), d);
    }
    acc[m] = fmaf(scale, d, acc[m]);
  }
}

template <int M, int VEC>
__global__ void __launch_bounds__(kWarps * 32)
    nvfp4_gemv_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                      const float* __restrict__ tensor_scale, const __nv_bfloat16* __restrict__ x,
                      float* __restrict__ y, int64_t N, int64_t blocks) {
  constexpr int kBlocksPerLoad = VEC / 8;
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const int64_t row_bytes = blocks * 8, ldx = blocks * 16;
  const uint8_t* crow = codes + n * row_bytes;
  const uint8_t* srow = scales + n * blocks;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
#pragma unroll 4
  for (int64_t b0 = static_cast<int64_t>(lane) * kBlocksPerLoad; b0 < blocks; b0 += 32 * kBlocksPerLoad) {
    if constexpr (VEC == 16) {
      const uint4 c = __ldg(reinterpret_cast<const uint4*>(crow + b0 * 8));
      const uint16_t s2 = static_cast<uint16_t>(__ldg(srow + b0)) | (static_cast<uint16_t>(__ldg(srow + b0 + 1)) << 8);
      block_fma<M>(c.x, c.y, e4m3_to_float(s2 & 0xFF) * 16384.0f, x, ldx, b0 * 16, acc);
      block_fma<M>(c.z, c.w, e4m3_to_float(s2 >> 8) * 16384.0f, x, ldx, (b0 + 1) * 16, acc);
    } else {
      const uint2 c = __ldg(reinterpret_cast<const uint2*>(crow + b0 * 8));
      block_fma<M>(c.x, c.y, e4m3_to_float(__ldg(srow + b0)) * 16384.0f, x, ldx, b0 * 16, acc);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[m] += __shfl_xor_sync(0xFFFFFFFFu, acc[m], off);
  }
  const float s_dec = __ldg(tensor_scale);
#pragma unroll
  for (int m = 0; m < M; ++m)
    if (lane == m) y[m * N + n] = acc[m] * s_dec;
}

template <int M>
void launch(bool vec16, const uint8_t* codes, const uint8_t* scales, const float* ts, const __nv_bfloat16* x, float* y,
            int64_t N, int64_t blocks, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((N + kWarps - 1) / kWarps)), block(kWarps * 32);
  if (vec16)
    nvfp4_gemv_kernel<M, 16><<<grid, block, 0, stream>>>(codes, scales, ts, x, y, N, blocks);
  else
    nvfp4_gemv_kernel<M, 8><<<grid, block, 0, stream>>>(codes, scales, ts, x, y, N, blocks);
}

}  // namespace

std::string gemv(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x_in, float* y,
                 int64_t M, int64_t N, int64_t blocks, void* stream_in) {
  if (M <= 0 || N <= 0) return "";
  if (reinterpret_cast<uintptr_t>(codes) % 8 != 0) return "codes pointer is not 8-byte aligned";
  if (reinterpret_cast<uintptr_t>(x_in) % 16 != 0) return "activation pointer is not 16-byte aligned";
  if (N > (int64_t{1} << 31) * kWarps) return "N too large";
  const bool vec16 = (blocks % 2 == 0) && reinterpret_cast<uintptr_t>(codes) % 16 == 0;
  auto stream = static_cast<cudaStream_t>(stream_in);
  const auto* x = static_cast<const __nv_bfloat16*>(x_in);
  const int64_t ldx = blocks * 16;
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    const int64_t mc = M - m0 < 16 ? M - m0 : 16;
    const __nv_bfloat16* xm = x + m0 * ldx;
    float* ym = y + m0 * N;
    switch (mc) {
#define SLM_NVFP4_CASE(k) \
  case k: launch<k>(vec16, codes, scales, tensor_scale, xm, ym, N, blocks, stream); break;
      SLM_NVFP4_CASE(1) SLM_NVFP4_CASE(2) SLM_NVFP4_CASE(3) SLM_NVFP4_CASE(4) SLM_NVFP4_CASE(5) SLM_NVFP4_CASE(6)
      SLM_NVFP4_CASE(7) SLM_NVFP4_CASE(8) SLM_NVFP4_CASE(9) SLM_NVFP4_CASE(10) SLM_NVFP4_CASE(11)
      SLM_NVFP4_CASE(12) SLM_NVFP4_CASE(13) SLM_NVFP4_CASE(14) SLM_NVFP4_CASE(15) SLM_NVFP4_CASE(16)
#undef SLM_NVFP4_CASE
      default: return "bad batch size";
    }
  }
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string(cudaGetErrorString(err));
}

}  // namespace slm::nvfp4::cuda
