// Split-key ("flash decoding") attention for one query token per row, reading the row's length from device memory so
// that a decode step can be captured once in a CUDA graph and replayed at every position.
//
// Why: a decode step through at::scaled_dot_product_attention sees a new key length every token; cuDNN's backend
// plans a graph per shape (~18 ms per call on an H200, bench/RESULTS.md), and any libtorch form needs the length on
// the host, which a captured graph cannot change. Here the grid depends only on the cache's capacity.
//
// Pass 1, grid (splits, H, B), 4 warps: CTA (s, h, b) takes keys [s·chunk, (s+1)·chunk) ∩ [len - window, len) of kv
// head h / (H / KV). Each warp walks its share of the keys with an online softmax; lane i holds the head dim's
// elements [i·VPL, (i+1)·VPL) of q and of the accumulator, so a score is one warp all-reduce. The warps merge in
// shared memory and the CTA writes (max, sum, unnormalized accumulator).
// Pass 2, grid (H, B), D threads: merges the splits, out = Σ_s acc_s e^{m_s - M} / Σ_s l_s e^{m_s - M}.
// keep (optional, [B, capacity] bytes): only keys with a non-zero byte take part. A DSA layer's decode step passes the
// keys its indexer selected (ops/dsa_select.h), so its sparse attention is this kernel with a mask instead of a
// gather of the selected rows and a dense attention over them. A split with no kept key writes m = -inf, which pass 2
// skips.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"
#include "slm/ops/cuda/element.cuh"

namespace slm::ops::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kKeys = 4;  // keys in flight per warp
template <class T, int VPL>
__device__ __forceinline__ void load_lane(const T* p, float (&out)[VPL]) {
#pragma unroll
  for (int i = 0; i < VPL; ++i) out[i] = to_float(p[i]);
}

template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    decode_partial(DecodeAttentionShape s, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const int64_t* __restrict__ lengths, const uint8_t* __restrict__ keep, float* __restrict__ part_ml,
                   float* __restrict__ part_acc) {
  constexpr int VPL = D / 32;
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t len = lengths[b];
  const int64_t chunk = (s.capacity + s.splits - 1) / s.splits;
  int64_t lo = split * chunk, hi = lo + chunk;
  if (hi > len) hi = len;
  if (s.window > 0 && lo < len - s.window) lo = len - s.window;
  const int kvh = h / (s.heads / s.kv_heads);
  const T* kp = k + ((b * s.kv_heads + kvh) * s.capacity) * D + lane * VPL;
  const T* vp = v + ((b * s.kv_heads + kvh) * s.capacity) * D + lane * VPL;
  float qv[VPL], acc[VPL];
  load_lane<T, VPL>(q + (b * s.heads + h) * D + lane * VPL, qv);
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    qv[i] *= s.scale;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const uint8_t* kept = keep ? keep + static_cast<int64_t>(b) * s.capacity : nullptr;
  // kKeys keys per warp per round, their loads issued together: one key at a time, a warp waited a full memory
  // latency per key (17 us for 2,000 keys of the cmake specialist on an H200, at a few MB read).
  for (int64_t j0 = lo + warp; j0 < hi; j0 += kWarps * kKeys) {
    float kv[kKeys][VPL], vv[kKeys][VPL], dot[kKeys];
    bool ok[kKeys];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int64_t j = j0 + u * kWarps;
      ok[u] = j < hi && (!kept || kept[j]);  // the same for the whole warp
      if (ok[u]) {
        load_lane<T, VPL>(kp + j * D, kv[u]);
        load_lane<T, VPL>(vp + j * D, vv[u]);
      }
    }
    bool any = false;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      dot[u] = 0.f;
      if (!ok[u]) continue;
      any = true;
#pragma unroll
      for (int i = 0; i < VPL; ++i) dot[u] += qv[i] * kv[u][i];
    }
    if (!any) continue;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int u = 0; u < kKeys; ++u) dot[u] += __shfl_xor_sync(kFullMask, dot[u], o);
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kKeys; ++u)
      if (ok[u]) m_new = fmaxf(m_new, dot[u]);
    const float corr = __expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int i = 0; i < VPL; ++i) acc[i] *= corr;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      if (!ok[u]) continue;
      const float p = __expf(dot[u] - m_new);
      l += p;
#pragma unroll
      for (int i = 0; i < VPL; ++i) acc[i] += p * vv[u][i];
    }
    m = m_new;
  }
  __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][D];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < VPL; ++i) sacc[warp][lane * VPL + i] = acc[i];
  __syncthreads();
  float mm = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, sm[w]);
  const int64_t row = (static_cast<int64_t>(b) * s.heads + h) * s.splits + split;
  for (int d = threadIdx.x; d < D; d += kWarps * 32) {
    float a = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (sm[w] > -INFINITY) a += sacc[w][d] * __expf(sm[w] - mm);
    part_acc[row * D + d] = a;
  }
  if (threadIdx.x == 0) {
    float ll = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (sm[w] > -INFINITY) ll += sl[w] * __expf(sm[w] - mm);
    part_ml[row * 2] = mm;
    part_ml[row * 2 + 1] = ll;
  }
}

// One CTA per (head, row), D threads. The splits' weights e^{m_s - M} are computed once, into shared memory, so the
// sum over splits is one independent load per split and thread (a thread that walked the splits' maxima and sums
// itself took 10 us for 65 splits).
template <class T, int D>
__global__ void __launch_bounds__(D) decode_combine(DecodeAttentionShape s, const float* __restrict__ part_ml,
                                                    const float* __restrict__ part_acc, T* __restrict__ out) {
  static_assert(D % 32 == 0, "whole warps");
  constexpr int kW = D / 32;
  __shared__ float weight[kMaxSplits];
  __shared__ float red[kW];
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x, lane = d % 32, warp = d / 32;
  const int64_t base = (static_cast<int64_t>(b) * s.heads + h) * s.splits;
  const auto block_reduce = [&](float v, bool is_max) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float t = __shfl_xor_sync(kFullMask, v, o);
      v = is_max ? fmaxf(v, t) : v + t;
    }
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
#pragma unroll
    for (int w = 1; w < kW; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    __syncthreads();  // red is reused
    return r;
  };
  float mm = -INFINITY;
  for (int64_t i = d; i < s.splits; i += D) mm = fmaxf(mm, part_ml[(base + i) * 2]);
  mm = block_reduce(mm, true);
  float l = 0.f;
  for (int64_t i = d; i < s.splits; i += D) {
    const float mi = part_ml[(base + i) * 2];
    const float w = mi == -INFINITY ? 0.f : __expf(mi - mm);  // a split with no key of the row's range
    weight[i] = w;
    l += part_ml[(base + i) * 2 + 1] * w;
  }
  l = block_reduce(l, false);  // its barrier also publishes weight[]
  float a = 0.f;
#pragma unroll 8
  for (int64_t i = 0; i < s.splits; ++i) a += part_acc[(base + i) * D + d] * weight[i];
  out[(static_cast<int64_t>(b) * s.heads + h) * D + d] = from_float<T>(a / l);
}

template <class T, int D>
std::string launch(const DecodeAttentionShape& s, const void* q, const void* k, const void* v, const int64_t* lengths,
                   const uint8_t* keep, void* out, float* part_ml, float* part_acc, cudaStream_t stream) {
  const dim3 grid1(static_cast<unsigned>(s.splits), static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  decode_partial<T, D><<<grid1, kWarps * 32, 0, stream>>>(s, static_cast<const T*>(q), static_cast<const T*>(k),
                                                          static_cast<const T*>(v), lengths, keep, part_ml, part_acc);
  const dim3 grid2(static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  decode_combine<T, D><<<grid2, D, 0, stream>>>(s, part_ml, part_acc, static_cast<T*>(out));
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

template <class T>
std::string launch_dim(const DecodeAttentionShape& s, const void* q, const void* k, const void* v,
                       const int64_t* lengths, const uint8_t* keep, void* out, float* part_ml, float* part_acc,
                       cudaStream_t stream) {
  switch (s.head_dim) {
    case 32: return launch<T, 32>(s, q, k, v, lengths, keep, out, part_ml, part_acc, stream);
    case 64: return launch<T, 64>(s, q, k, v, lengths, keep, out, part_ml, part_acc, stream);
    case 128: return launch<T, 128>(s, q, k, v, lengths, keep, out, part_ml, part_acc, stream);
    case 256: return launch<T, 256>(s, q, k, v, lengths, keep, out, part_ml, part_acc, stream);
    default: return "decode attention: head dim " + std::to_string(s.head_dim) + " is not compiled";
  }
}

}  // namespace

bool decode_attention_supported(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

std::string decode_attention(const DecodeAttentionShape& s, DecodeDtype dtype, const void* q, const void* k,
                             const void* v, const int64_t* lengths, const uint8_t* keep, void* out, float* partial_ml,
                             float* partial_acc, void* stream) {
  if (s.splits < 1 || s.splits > kMaxSplits)
    return "decode attention: " + std::to_string(s.splits) + " key ranges (1.." + std::to_string(kMaxSplits) + ")";
  auto st = static_cast<cudaStream_t>(stream);
  return with_element_type(dtype, [&](auto tag) {
    return launch_dim<TagType<decltype(tag)>>(s, q, k, v, lengths, keep, out, partial_ml, partial_acc, st);
  });
}

}  // namespace slm::ops::cuda
