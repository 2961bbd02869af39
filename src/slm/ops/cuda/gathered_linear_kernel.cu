// Matrix-vector products with a matrix picked per row by an id on the device: the routed experts of a decode step,
// each (token, slot) assignment against its own expert's weights, read in place.
//
// Why: the tensor-op form (index_select of the selected experts' matrices, then bmm) copies every selected matrix
// before reading it again: on hybrid-250m in BF16 that copy was the largest single kernel family of a graphed decode
// step, 0.17 of 1.49 ms on an H200 (bench/RESULTS.md). One warp per output row streams the row in 16-byte loads.
//
// gathered_swiglu_combine is the MoE's down projection with everything around it: the SwiGLU of each assignment's
// hidden row, its product with its expert's w2, the gate-weighted sum over a token's k assignments and the shared
// expert's down projection, which as tensor ops were about eight launches per MoE layer of a decode step.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/gathered_linear_kernel.h"
#include "slm/ops/cuda/nvfp4_decode.cuh"

namespace slm::ops::cuda {

namespace {

constexpr int kWarps = 8;  // output rows per CTA

// O: the output's element type, T's or FP32.
template <class T, class O>
__global__ void gathered_linear_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                       const int64_t* __restrict__ ids, O* __restrict__ y, int64_t x_div, int64_t out,
                                       int64_t in) {
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte load
  const int64_t a = blockIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= out) return;
  const int lane = threadIdx.x % 32;
  const T* wr = w + ((ids ? ids[a] : 0) * out + row) * in;
  const T* xr = x + (a / x_div) * in;
  float acc = 0.0f;
#pragma unroll 4
  for (int64_t j = static_cast<int64_t>(lane) * kVec; j < in; j += 32 * kVec) {
    const uint4 wv = *reinterpret_cast<const uint4*>(wr + j);
    const uint4 xv = *reinterpret_cast<const uint4*>(xr + j);
    const T* we = reinterpret_cast<const T*>(&wv);
    const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc += load(we + e) * load(xe + e);
  }
  acc = warp_sum(acc);
  if (lane == 0) store(y + a * out + row, acc);
}

// CTA (block of kWarps output rows, token t). The prologue puts gate_s · act(h[t·k + s]) for every slot s, and
// act(h_shared[t]), in shared memory as FP32, with each slot's expert; then each warp dots its row of every selected
// expert's w2 (and of the shared expert's) with them. A warp's 16-byte chunks of those rows are one flat range that
// each lane walks kUnroll loads at a time: a row of one expert is only a few chunks per lane (384 BF16 values: 1.5),
// and a loop per slot kept about one load in flight per lane (23 us per layer of the cmake specialist on an H200;
// loading the first chunks before the prologue, with the ids read from global memory, took 9.4 us against 7.6:
// bench/RESULTS.md).
// Both phases move whole 16-byte chunks: the prologue reads a chunk of the gate half and of the up half of h per
// iteration, and the dot reads a chunk's activations as float4. Element by element, the prologue issued twice the
// loads of the dot itself, and lanes reading activations 8 floats apart hit the same shared-memory banks 8 ways.
// The prologue both combine kernels share: act[s·hidden + j] = gate_s · silu(h[t·k + s][j]) · h[t·k + s][hidden + j]
// for every slot s, then act[k·hidden + j] = silu(h_shared[t][j]) · h_shared[t][shared_hidden + j], as FP32 in shared
// memory, in whole 16-byte chunks of h; and each slot's expert id. Ends with a barrier. kBf16: silu · up is rounded to
// BF16 before the gate multiplies it, as the NVFP4 GEMV rounds its input (quant/cuda/nvfp4_gemv.cu).
template <bool kBf16, class T>
__device__ __forceinline__ void swiglu_prologue(const T* __restrict__ h, const int64_t* __restrict__ ids,
                                                const float* __restrict__ gates, const T* __restrict__ h_shared,
                                                int64_t t, int k, int hidden, int shared_hidden, float4* act4,
                                                int64_t* expert) {
  constexpr int kVec = 16 / sizeof(T);
  static_assert(kVec % 4 == 0, "a chunk's activations are whole float4s");
  const auto silu = [](float v) { return v / (1.0f + expf(-v)); };
  const int per_slot = hidden / kVec, routed = k * per_slot, chunks = routed + shared_hidden / kVec;
  // act[at .. at + kVec) = scale · silu(gate half) · up half, for the row's chunk at column j.
  const auto activate = [&](const T* row, int half, int j, float scale, int at) {
    const uint4 gv = *reinterpret_cast<const uint4*>(row + j);
    const uint4 uv = *reinterpret_cast<const uint4*>(row + half + j);
    const T* ge = reinterpret_cast<const T*>(&gv);
    const T* ue = reinterpret_cast<const T*>(&uv);
    const auto one = [&](int e) {
      if constexpr (kBf16)
        return scale * __bfloat162float(__float2bfloat16(silu(load(ge + e)) * load(ue + e)));
      else
        return scale * silu(load(ge + e)) * load(ue + e);
    };
#pragma unroll
    for (int e = 0; e < kVec; e += 4) act4[(at + e) / 4] = make_float4(one(e), one(e + 1), one(e + 2), one(e + 3));
  };
#pragma unroll 2
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    if (c < routed) {
      const int s = c / per_slot, j = (c % per_slot) * kVec;
      activate(h + (t * k + s) * 2 * hidden, hidden, j, gates[t * k + s], s * hidden + j);
    } else {
      const int j = (c - routed) * kVec;
      activate(h_shared + t * 2 * shared_hidden, shared_hidden, j, 1.0f, k * hidden + j);
    }
  }
  for (int s = threadIdx.x; s < k; s += blockDim.x) expert[s] = ids[t * k + s];
  __syncthreads();
}

template <class T>
__global__ void gathered_swiglu_combine_kernel(const T* __restrict__ h, const T* __restrict__ w,
                                               const int64_t* __restrict__ ids, const float* __restrict__ gates,
                                               const T* __restrict__ h_shared, const T* __restrict__ w_shared,
                                               T* __restrict__ y, int k, int out, int hidden, int shared_hidden) {
  // 8 loads in flight per lane: a cmake specialist row is 18 chunks per lane, 3 rounds of memory latency instead of
  // 5 (measured on an H200: 4.7 -> 4.2 us per call for hybrid-250m, 11.8 -> 11.6 for the cmake specialist).
  constexpr int kVec = 16 / sizeof(T), kUnroll = 8;
  extern __shared__ float4 act4[];  // [k * hidden + shared_hidden] floats, then k expert ids
  float* act = reinterpret_cast<float*>(act4);
  auto* expert = reinterpret_cast<int64_t*>(act + (k * hidden + shared_hidden + 1) / 2 * 2);
  const int64_t t = blockIdx.y;
  swiglu_prologue<false>(h, ids, gates, h_shared, t, k, hidden, shared_hidden, act4, expert);
  // Chunk c < k * per_slot: slot c / per_slot, columns from (c % per_slot) * kVec; then the shared expert's.
  const int per_slot = hidden / kVec, routed = k * per_slot, chunks = routed + shared_hidden / kVec;
  const int r = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (r >= out) return;
  const int lane = threadIdx.x % 32;
  const auto source = [&](int c, int& a) -> const T* {
    if (c < routed) {
      const int s = c / per_slot, j = (c % per_slot) * kVec;
      a = s * hidden + j;
      return w + (expert[s] * out + r) * static_cast<int64_t>(hidden) + j;
    }
    const int j = (c - routed) * kVec;
    a = k * hidden + j;
    return w_shared + static_cast<int64_t>(r) * shared_hidden + j;
  };
  float acc = 0.0f;
  for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    uint4 wv[kUnroll];
    int at[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + 32 * u < chunks) wv[u] = *reinterpret_cast<const uint4*>(source(c0 + 32 * u, at[u]));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + 32 * u >= chunks) continue;
      const T* we = reinterpret_cast<const T*>(&wv[u]);
#pragma unroll
      for (int e = 0; e < kVec; e += 4) {
        const float4 a = act4[(at[u] + e) / 4];
        acc += load(we + e) * a.x;
        acc += load(we + e + 1) * a.y;
        acc += load(we + e + 2) * a.z;
        acc += load(we + e + 3) * a.w;
      }
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) store(y + t * out + r, acc);
}

// The combine with NVFP4 down projections: the same prologue (activations rounded to BF16, the NVFP4 products'
// input), then each warp's row of every selected expert's w2 (and the shared expert's) in chunks of 32 weights: 16
// bytes of codes and the two block scales. The weights decode as the GEMV's do (nvfp4_decode.cuh: a few
// integer ops and one BF16x2 multiply per pair, exact). A shared-memory table per nibble took 16.9 us per call on the
// cmake specialist, this 15.5 (H200), both above the BF16 kernel's 11.6 us for four times the bytes: what bounds it
// is not measured yet.
template <class T>
__global__ void gathered_swiglu_combine_nvfp4_kernel(const T* __restrict__ h, Nvfp4Matrices w,
                                                     const int64_t* __restrict__ ids, const float* __restrict__ gates,
                                                     const T* __restrict__ h_shared, Nvfp4Matrices ws,
                                                     T* __restrict__ y, int k, int out, int hidden, int shared_hidden) {
  constexpr int kWeights = 32, kUnroll = 4;
  extern __shared__ float4 act4[];  // [k * hidden + shared_hidden] floats, then k expert ids
  float* act = reinterpret_cast<float*>(act4);
  auto* expert = reinterpret_cast<int64_t*>(act + (k * hidden + shared_hidden + 1) / 2 * 2);
  const int64_t t = blockIdx.y;
  swiglu_prologue<true>(h, ids, gates, h_shared, t, k, hidden, shared_hidden, act4, expert);  // ends with a barrier
  const int per_slot = hidden / kWeights, routed = k * per_slot, chunks = routed + shared_hidden / kWeights;
  const int r = static_cast<int>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (r >= out) return;
  const int lane = threadIdx.x % 32;
  // Chunk c: its codes, scales, tensor scale and first activation.
  struct Chunk {
    uint4 codes;
    uint32_t scales;
    float s_dec;
    int at;
  };
  const auto fetch = [&](int c, Chunk& q) {
    const Nvfp4Matrices* m = &w;
    int64_t row;
    int j, in;
    if (c < routed) {
      const int s = c / per_slot;
      j = (c % per_slot) * kWeights;
      row = expert[s] * out + r;
      in = hidden;
      q.at = s * hidden + j;
      q.s_dec = __ldg(w.tensor_scale + expert[s]);
    } else {
      m = &ws;
      j = (c - routed) * kWeights;
      row = r;
      in = shared_hidden;
      q.at = k * hidden + j;
      q.s_dec = __ldg(ws.tensor_scale);
    }
    q.codes = *reinterpret_cast<const uint4*>(m->codes + row * (in / 2) + j / 2);
    q.scales = *reinterpret_cast<const uint16_t*>(m->scales + row * (in / 16) + j / 16);
  };
  float acc = 0.0f;
  for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    Chunk q[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + 32 * u < chunks) fetch(c0 + 32 * u, q[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + 32 * u >= chunks) continue;
      const uint32_t words[4] = {q[u].codes.x, q[u].codes.y, q[u].codes.z, q[u].codes.w};
      const uint32_t sc[2] = {scale_bf16x2(q[u].scales & 0xFF),
                              scale_bf16x2(q[u].scales >> 8)};
      float sum = 0.0f;  // of weight * scale * 2^-8 * activation
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {  // word wi: elements 8 wi .. 8 wi + 7 of the chunk, block wi / 2
        uint32_t o[4];
        decode_word(words[wi], o);
        const float4 a0 = act4[(q[u].at + wi * 8) / 4], a1 = act4[(q[u].at + wi * 8 + 4) / 4];
        const float lo[4] = {a0.x, a0.y, a0.z, a0.w}, hi[4] = {a1.x, a1.y, a1.z, a1.w};
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {  // o[jj] holds elements jj and jj + 4
          const uint32_t v = bf16x2_mul(o[jj], sc[wi / 2]);
          sum += __uint_as_float(v << 16) * lo[jj] + __uint_as_float(v & 0xFFFF0000u) * hi[jj];
        }
      }
      acc += q[u].s_dec * 256.0f * sum;  // undo the 2^-8
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) store(y + t * out + r, acc);
}

template <class T>
std::string launch(const void* x, const void* w, const int64_t* ids, void* y, bool float_out, int64_t assignments,
                   int64_t x_div, int64_t out, int64_t in, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((out + kWarps - 1) / kWarps), static_cast<unsigned>(assignments));
  if (float_out)
    gathered_linear_kernel<T, float><<<grid, kWarps * 32, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), ids, static_cast<float*>(y), x_div, out, in);
  else
    gathered_linear_kernel<T, T><<<grid, kWarps * 32, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                                   ids, static_cast<T*>(y), x_div, out, in);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("gathered linear kernel: ") + cudaGetErrorString(e);
}

template <class T>
std::string launch_combine(const void* h, const void* w, const int64_t* ids, const float* gates, const void* h_shared,
                           const void* w_shared, void* y, int64_t tokens, int64_t k, int64_t out, int64_t hidden,
                           int64_t shared_hidden, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((out + kWarps - 1) / kWarps), static_cast<unsigned>(tokens));
  const size_t smem = combine_shared_bytes(k, hidden, shared_hidden);
  gathered_swiglu_combine_kernel<T><<<grid, kWarps * 32, smem, stream>>>(
      static_cast<const T*>(h), static_cast<const T*>(w), ids, gates, static_cast<const T*>(h_shared),
      static_cast<const T*>(w_shared), static_cast<T*>(y), static_cast<int>(k), static_cast<int>(out),
      static_cast<int>(hidden), static_cast<int>(shared_hidden));
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("gathered swiglu combine kernel: ") + cudaGetErrorString(e);
}

}  // namespace

std::string gathered_swiglu_combine(DecodeDtype dtype, const void* h, const void* w, const int64_t* ids,
                                    const float* gates, const void* h_shared, const void* w_shared, void* y,
                                    int64_t tokens, int64_t k, int64_t out, int64_t hidden, int64_t shared_hidden,
                                    void* stream) {
  if (tokens == 0 || out == 0) return "";
  if (tokens > 65535 || k < 1 || hidden < 1 || shared_hidden < 0 ||
      combine_shared_bytes(k, hidden, shared_hidden) > kMaxCombineSharedBytes)
    return "gathered swiglu combine kernel: bad token count, slots or hidden sizes";
  const auto s = static_cast<cudaStream_t>(stream);
  return with_element_type(dtype, [&](auto tag) {
    return launch_combine<TagType<decltype(tag)>>(h, w, ids, gates, h_shared, w_shared, y, tokens, k, out, hidden,
                                                  shared_hidden, s);
  });
}

std::string gathered_swiglu_combine_nvfp4(DecodeDtype dtype, const void* h, const Nvfp4Matrices& w, const int64_t* ids,
                                          const float* gates, const void* h_shared, const Nvfp4Matrices& w_shared,
                                          void* y, int64_t tokens, int64_t k, int64_t out, int64_t hidden,
                                          int64_t shared_hidden, void* stream) {
  if (tokens == 0 || out == 0) return "";
  if (tokens > 65535 || k < 1 || hidden < 32 || hidden % 32 != 0 || shared_hidden < 0 || shared_hidden % 32 != 0 ||
      combine_shared_bytes(k, hidden, shared_hidden) > kMaxCombineSharedBytes)
    return "gathered swiglu combine kernel (NVFP4): bad token count, slots or hidden sizes";
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>((out + kWarps - 1) / kWarps), static_cast<unsigned>(tokens));
  const size_t smem = combine_shared_bytes(k, hidden, shared_hidden);
  return with_element_type(dtype, [&](auto tag) {
    using T = TagType<decltype(tag)>;
    gathered_swiglu_combine_nvfp4_kernel<T><<<grid, kWarps * 32, smem, s>>>(
        static_cast<const T*>(h), w, ids, gates, static_cast<const T*>(h_shared), w_shared, static_cast<T*>(y),
        static_cast<int>(k), static_cast<int>(out), static_cast<int>(hidden), static_cast<int>(shared_hidden));
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? std::string()
                            : std::string("gathered swiglu combine kernel (NVFP4): ") + cudaGetErrorString(e);
  });
}

std::string gathered_linear(DecodeDtype dtype, const void* x, const void* w, const int64_t* ids, void* y,
                            bool float_out, int64_t assignments, int64_t x_div, int64_t out, int64_t in, void* stream) {
  if (assignments == 0 || out == 0) return "";
  if (assignments > 65535 || x_div < 1) return "gathered linear kernel: bad assignment count or divisor";
  const auto s = static_cast<cudaStream_t>(stream);
  return with_element_type(dtype, [&](auto tag) {
    return launch<TagType<decltype(tag)>>(x, w, ids, y, float_out, assignments, x_div, out, in, s);
  });
}

}  // namespace slm::ops::cuda
