// The rotary embedding and the per-head RMSNorm after it (attention's QK-norm): for one decode token, one CTA per
// (row, head) and one thread per (real, imaginary) pair; for training, a whole [B, T, heads, dim] block forward and
// backward, one warp per token (b, t) going through its heads (below).
//
// Why: as tensor ops a decode step's rotation costs about ten kernels per tensor (two table lookups, four products,
// a sum, a difference, the concatenation, the norm): some twenty launches per attention layer for two [heads, 128]
// vectors, each a few microseconds of GPU time (bench/RESULTS.md). The rotation rounds to the tensor's dtype after
// every product and sum, as those ops do, so that it gives their values bit for bit; the norm reduces in FP32.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

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

// Training: one warp per token (b, t), kTrainWarps warps per CTA, each lane holding the pairs lane, lane + 32, ...
// (K of them, K a power of two with 32 K >= half), so the arrays below stay in registers (every index is a
// compile-time one after unrolling) and a warp's loads of a half row are contiguous. The warp reads the token's
// position and its cos/sin once, then goes through the token's heads (adjacent rows of x): with a warp per row the
// position's divisions, the table reads and their conversions took as many instructions as the rotation, and the
// kernel was bound by its issue rate rather than by memory (Nsight Compute on an H200).
constexpr int kTrainWarps = 8;
constexpr int kTrainThreads = 32 * kTrainWarps;
// Forward CTAs at most (grid-stride beyond); the backward's CTAs at most, a grid that depends on the token count
// alone (not on the device), so that its partials [<= 1024, dim] sum the same way on every run.
constexpr int64_t kTrainForwardMaxBlocks = 4096;
constexpr int64_t kTrainBackwardMaxBlocks = 1024;


// Two values rounded to T (round_to of each) with one packed conversion instead of two: the BF16/FP16 conversions
// are a good part of these kernels' instructions.
__device__ __forceinline__ void round_pair(float&, float&, const float*) {}
__device__ __forceinline__ void round_pair(float& a, float& b, const __nv_bfloat16*) {
  const float2 r = __bfloat1622float2(__floats2bfloat162_rn(a, b));
  a = r.x, b = r.y;
}
__device__ __forceinline__ void round_pair(float& a, float& b, const __half*) {
  const float2 r = __half22float2(__floats2half2_rn(a, b));
  a = r.x, b = r.y;
}

// *p = a, *q = b in T, with one packed conversion.
__device__ __forceinline__ void store_pair(float* p, float* q, float a, float b) {
  *p = a, *q = b;
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, __nv_bfloat16* q, float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  *p = v.x, *q = v.y;
}
__device__ __forceinline__ void store_pair(__half* p, __half* q, float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  *p = v.x, *q = v.y;
}

// The cos and sin of token b * tokens + t (position ids[b or 0][t], else start + t) for this lane's pairs (zero past
// half). 32-bit division (fewer than 2^31 rows, train_check): 64-bit division is a call, which made ptxas spill.
template <class T, int K>
__device__ __forceinline__ void token_tables(const RotaryNormTrainArgs& a, int64_t token, int lane, float (&c)[K],
                                             float (&s)[K]) {
  const unsigned tokens = static_cast<unsigned>(a.tokens), bt = static_cast<unsigned>(token), t = bt % tokens;
  const int64_t position =
      a.ids ? a.ids[static_cast<int64_t>(a.ids_rows == 1 ? 0u : bt / tokens) * tokens + t] : a.start + t;
  const int half = static_cast<int>(a.half);
  const bool inside = position >= 0 && position < a.table_rows;
  const int64_t at = (inside ? position : 0) * half;
  const T* ct = static_cast<const T*>(a.cos) + at;
  const T* st = static_cast<const T*>(a.sin) + at;
  // Outside the tables: NaN (visible in the loss) instead of a read past them. Added rather than selected per
  // element, which made ptxas spill.
  const float poison = inside ? 0.f : __int_as_float(0x7fc00000);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = lane + 32 * k;
    c[k] = i < half ? load(ct + i) + poison : 0.f;
    s[k] = i < half ? load(st + i) + poison : 0.f;
  }
}

// The rotated pairs (r1[k], r2[k]) = (x1 c - x2 s, x2 c + x1 s) of this lane's pairs of the row at xv (zero past
// half), rounded to T after each product and sum as the tensor ops round. Returns the lane's sum of squares. Forward
// and backward call this one function, so the backward recomputes the forward's r exactly.
template <class T, int K>
__device__ __forceinline__ float rotate_row(const T* __restrict__ xv, int half, int lane, const float (&c)[K],
                                            const float (&s)[K], float (&r1)[K], float (&r2)[K]) {
  const T* tag = nullptr;  // picks round_pair's rounding
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = lane + 32 * k;
    r1[k] = r2[k] = 0.f;
    if (i < half) {
      const float x1 = load(xv + i), x2 = load(xv + i + half);
      // _rn: no FMA contraction, which would skip the products' rounding.
      float x1c = __fmul_rn(x1, c[k]), x2c = __fmul_rn(x2, c[k]), x2s = __fmul_rn(x2, s[k]), x1s = __fmul_rn(x1, s[k]);
      round_pair(x1c, x2c, tag);
      round_pair(x2s, x1s, tag);
      r1[k] = __fsub_rn(x1c, x2s);
      r2[k] = __fadd_rn(x2c, x1s);
      round_pair(r1[k], r2[k], tag);
      ss = fmaf(r1[k], r1[k], ss);
      ss = fmaf(r2[k], r2[k], ss);
    }
  }
  return ss;
}

// rsqrt(mean(r^2) + eps) from the row's sum of squares; _rn so that forward and backward form the same value.
__device__ __forceinline__ float row_rstd(float ss, const RotaryNormTrainArgs& a) {
  return rsqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(2 * a.half)), a.eps));
}

// This lane's weights (1 without a weight or past half), read once for all of the warp's rows.
template <class W, int K>
__device__ __forceinline__ void lane_weights(const W* weight, int half, int lane, float (&w1)[K], float (&w2)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = lane + 32 * k;
    w1[k] = weight && i < half ? load(weight + i) : 1.f;
    w2[k] = weight && i < half ? load(weight + i + half) : 1.f;
  }
}

// __launch_bounds__ with a minimum of 1 CTA per SM: without one ptxas capped some instances' registers and spilled.
template <class T, class W, int K>
__global__ void __launch_bounds__(kTrainThreads, 1)
    rotary_norm_train_forward_kernel(const RotaryNormTrainArgs a, const T* __restrict__ x, T* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int half = static_cast<int>(a.half), dim = 2 * half, heads = static_cast<int>(a.heads);
  const W* weight = static_cast<const W*>(a.weight);
  float w1[K], w2[K];
  lane_weights(weight, half, lane, w1, w2);
  const int64_t tokens = a.batch * a.tokens;
  for (int64_t token = static_cast<int64_t>(blockIdx.x) * kTrainWarps + threadIdx.x / 32; token < tokens;
       token += static_cast<int64_t>(gridDim.x) * kTrainWarps) {
    float c[K], s[K];
    token_tables<T, K>(a, token, lane, c, s);
    const T* xt = x + token * heads * dim;
    T* ot = out + token * heads * dim;
#pragma unroll 1  // unrolled by 2, the heads ran 10-20% slower on an H200
    for (int h = 0; h < heads; ++h) {
      float r1[K], r2[K];
      const float ss = rotate_row<T, K>(xt + h * dim, half, lane, c, s, r1, r2);
      const float rstd = weight ? row_rstd(warp_sum(ss), a) : 1.f;
      T* ov = ot + h * dim;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = lane + 32 * k;
        if (i < half)
          store_pair(ov + i, ov + i + half, weight ? r1[k] * rstd * w1[k] : r1[k],
                     weight ? r2[k] * rstd * w2[k] : r2[k]);
      }
    }
  }
}

// From gz = dL/dz: with rhat = r rstd, gr = rstd (w gz - rhat mean(w gz rhat)), then the inverse rotation
// gx1 = gr1 c + gr2 s, gx2 = gr2 c - gr1 s; dw accumulates gz rhat per lane in registers over the warp's rows, then
// per CTA in a fixed order over its warps (shared memory [kTrainWarps][dim]), one partials row per CTA: no atomics,
// so the weight's gradient is the same on every run.
template <class T, class W, int K>
__global__ void __launch_bounds__(kTrainThreads, 1)
    rotary_norm_train_backward_kernel(const RotaryNormTrainArgs a, const T* __restrict__ x, const T* __restrict__ gz,
                                      T* __restrict__ gx, float* __restrict__ partials) {
  extern __shared__ float warp_dw[];  // [kTrainWarps][2 * half] when partials
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = static_cast<int>(a.half), dim = 2 * half, heads = static_cast<int>(a.heads);
  const W* weight = static_cast<const W*>(a.weight);
  float w1[K], w2[K], dw1[K], dw2[K];
  lane_weights(weight, half, lane, w1, w2);
#pragma unroll
  for (int k = 0; k < K; ++k) dw1[k] = dw2[k] = 0.f;
  const int64_t tokens = a.batch * a.tokens;
  for (int64_t token = static_cast<int64_t>(blockIdx.x) * kTrainWarps + warp; token < tokens;
       token += static_cast<int64_t>(gridDim.x) * kTrainWarps) {
    float c[K], s[K];
    token_tables<T, K>(a, token, lane, c, s);
    const int64_t offset = token * heads * dim;
#pragma unroll 1
    for (int h = 0; h < heads; ++h) {
      const T* gv = gz + offset + h * dim;
      float r1[K], r2[K], g1[K], g2[K];
      const float ss = rotate_row<T, K>(x + offset + h * dim, half, lane, c, s, r1, r2);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = lane + 32 * k;
        g1[k] = i < half ? load(gv + i) : 0.f;
        g2[k] = i < half ? load(gv + i + half) : 0.f;
      }
      if (weight) {
        const float rstd = row_rstd(warp_sum(ss), a);
        float dot = 0.f;  // sum of w gz rhat over the row
#pragma unroll
        for (int k = 0; k < K; ++k) {
          r1[k] *= rstd;  // rhat from here on
          r2[k] *= rstd;
          dot = fmaf(w1[k] * g1[k], r1[k], dot);
          dot = fmaf(w2[k] * g2[k], r2[k], dot);
        }
        const float mean = warp_sum(dot) / static_cast<float>(dim);
#pragma unroll
        for (int k = 0; k < K; ++k) {
          dw1[k] = fmaf(g1[k], r1[k], dw1[k]);
          dw2[k] = fmaf(g2[k], r2[k], dw2[k]);
          g1[k] = rstd * (w1[k] * g1[k] - r1[k] * mean);  // gr
          g2[k] = rstd * (w2[k] * g2[k] - r2[k] * mean);
        }
      }
      T* ov = gx + offset + h * dim;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = lane + 32 * k;
        if (i < half) store_pair(ov + i, ov + i + half, g1[k] * c[k] + g2[k] * s[k], g2[k] * c[k] - g1[k] * s[k]);
      }
    }
  }
  if (!partials) return;  // the same for the whole CTA
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      warp_dw[warp * dim + i] = dw1[k];
      warp_dw[warp * dim + i + half] = dw2[k];
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < dim; j += kTrainThreads) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kTrainWarps; ++w) sum += warp_dw[w * dim + j];
    partials[static_cast<int64_t>(blockIdx.x) * dim + j] = sum;
  }
}

// f(std::integral_constant<int, K>) for the pairs per lane that half needs (1..512 pairs: K = 1, 2, 4, 8 or 16).
template <class F>
std::string with_pairs_per_lane(int64_t half, F&& f) {
  if (half <= 32) return f(std::integral_constant<int, 1>{});
  if (half <= 64) return f(std::integral_constant<int, 2>{});
  if (half <= 128) return f(std::integral_constant<int, 4>{});
  if (half <= 256) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 16>{});
}

// f(x_tag, w_tag, pairs) for a's element type, its weight's (FP32 or the element type) and its pairs per lane.
template <class F>
std::string with_train_types(const RotaryNormTrainArgs& a, F&& f) {
  return with_element_type(a.dtype, [&](auto tag) {
    return with_pairs_per_lane(a.half, [&](auto pairs) {
      return a.weight_fp32 ? f(tag, static_cast<const float*>(nullptr), pairs) : f(tag, tag, pairs);
    });
  });
}

std::string train_check(const RotaryNormTrainArgs& a) {
  if (a.half < 1 || a.half > 512) return std::to_string(a.half) + " pairs per head (1..512)";
  if (a.ids && a.ids_rows != 1 && a.ids_rows != a.batch) return "ids must have 1 or batch rows";
  if (a.batch * a.tokens * a.heads >= (int64_t{1} << 31)) return "2^31 rows or more";
  return "";
}

std::string launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

std::string rotary_norm_train_forward(const RotaryNormTrainArgs& a, const void* x, void* out, void* stream) {
  const int64_t tokens = a.batch * a.tokens;
  if (tokens * a.heads == 0) return "";
  if (auto err = train_check(a); !err.empty()) return "rotary norm train kernel: " + err;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((tokens + kTrainWarps - 1) / kTrainWarps, kTrainForwardMaxBlocks));
  return with_train_types(a, [&](auto tag, auto wtag, auto pairs) {
    using T = TagType<decltype(tag)>;
    rotary_norm_train_forward_kernel<T, TagType<decltype(wtag)>, decltype(pairs)::value>
        <<<blocks, kTrainThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, static_cast<const T*>(x),
                                                                          static_cast<T*>(out));
    return launched("rotary norm train kernel");
  });
}

int64_t rotary_norm_train_backward_blocks(int64_t tokens) {
  return std::max<int64_t>(1, std::min<int64_t>((tokens + kTrainWarps - 1) / kTrainWarps, kTrainBackwardMaxBlocks));
}

std::string rotary_norm_train_backward(const RotaryNormTrainArgs& a, const void* x, const void* grad_out, void* grad_x,
                                       float* partials, void* stream) {
  if (auto err = train_check(a); !err.empty()) return "rotary norm train backward kernel: " + err;
  if (partials && !a.weight) return "rotary norm train backward kernel: partials without a weight";
  // An empty block still writes its (zero) partials, so the caller's sum needs no special case.
  const auto blocks = static_cast<unsigned>(rotary_norm_train_backward_blocks(a.batch * a.tokens));
  const size_t smem = partials ? sizeof(float) * kTrainWarps * 2 * a.half : 0;  // 32 KiB at most (half <= 512)
  return with_train_types(a, [&](auto tag, auto wtag, auto pairs) {
    using T = TagType<decltype(tag)>;
    rotary_norm_train_backward_kernel<T, TagType<decltype(wtag)>, decltype(pairs)::value>
        <<<blocks, kTrainThreads, smem, static_cast<cudaStream_t>(stream)>>>(
            a, static_cast<const T*>(x), static_cast<const T*>(grad_out), static_cast<T*>(grad_x), partials);
    return launched("rotary norm train backward kernel");
  });
}

std::string rotary_norm(DecodeDtype dtype, const void* x, void* out, const int64_t* positions, const void* cos,
                        const void* sin, const void* weight, int64_t rows, int64_t heads, int64_t half, float eps,
                        void* stream) {
  if (rows * heads == 0) return "";
  if (half < 1 || half > 512) return "rotary norm kernel: " + std::to_string(half) + " pairs per head (1..512)";
  const auto s = static_cast<cudaStream_t>(stream);
  return with_element_type(dtype, [&](auto tag) {
    return launch<TagType<decltype(tag)>>(x, out, positions, cos, sin, weight, rows, heads, half, eps, s);
  });
}

}  // namespace slm::ops::cuda
