// Fused M2RNN scan on sm_90: the whole sequence of one (batch row, head) in one CTA, its K×V state in registers.
//
// Why this shape: H_t = f H_{t-1} + (1 - f) tanh(H_{t-1} W + k vᵀ) acts on the rows of H independently (row r of
// H_{t-1} W is row r of H_{t-1} times W), so thread r owns state row r (V floats in registers) for all T tokens and
// the recurrence needs no communication at all. Only the reductions over rows cross threads: y_t = Σ_r q_r H_t[r]
// in the forward; dv_t, df_t and dW in the backward. Those go through warp shuffles in a reduce-scatter (a vector
// of N values is summed over 32 lanes in N - 1 shuffles, each lane ending with N/32 of the sums) and shared
// memory across warps, one barrier per stretch of `every` tokens. W (V×V) sits in shared memory, read as
// broadcasts. Inputs of a stretch are staged in shared memory with coalesced loads.
//
// Backward: the forward keeps the state entering every stretch; the backward walks the stretches in reverse,
// recomputes the stretch's states into a per-CTA global scratch (each thread its own rows: 64-byte coalesced
// writes, read back in reverse order while still hot in L2) and runs backpropagation through time with the
// reference's clipping, document resets and accumulation order per step.
//
// Numerics: FP32 throughout. tanh is 1 - 2 / (e^{2x} + 1) from one fast exponential (absolute error ~1e-7; tanhf
// costs several times as many instructions and the step takes V of them per row).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "slm/ops/cuda/m2rnn_scan_kernels.h"

namespace slm::ops::cuda {

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxRows = 256;  // K threads per CTA; __launch_bounds__ then leaves each thread 255 registers

__device__ __forceinline__ float fast_tanh(float x) {
  x = fminf(fmaxf(x, -15.f), 15.f);  // tanh(±15) rounds to ±1 in FP32, and e^30 keeps __fdividef in range
  return 1.f - __fdividef(2.f, __expf(2.f * x) + 1.f);
}

// Reduce-scatter of x[0..N) over the 32 lanes of a warp, N a power of two. At each level (lane bit OFF) a lane
// keeps one half of its live values and sends the other half to its partner, which keeps the opposite half; once
// one value is left the remaining levels are plain butterflies. Afterwards x[0..max(N/32, 1)) hold the sums of
// indices rs_base<N>(lane) + i; for N < 32 the lanes that differ only in their low log2(32/N) bits hold copies.
template <int N, int OFF, int A>
__device__ __forceinline__ void reduce_scatter_level(float (&x)[A], int lane) {
  if constexpr (OFF >= 1) {
    if constexpr (N >= 2) {
      constexpr int kHalf = N / 2;
      const bool upper = lane & OFF;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? x[i] : x[i + kHalf];
        const float keep = upper ? x[i + kHalf] : x[i];
        x[i] = keep + __shfl_xor_sync(kFullMask, send, OFF);
      }
      reduce_scatter_level<kHalf, OFF / 2>(x, lane);
    } else {
      x[0] += __shfl_xor_sync(kFullMask, x[0], OFF);
      reduce_scatter_level<1, OFF / 2>(x, lane);
    }
  }
}

template <int N, int A>
__device__ __forceinline__ void reduce_scatter(float (&x)[A], int lane) {
  reduce_scatter_level<N, 16>(x, lane);
}

template <int N>
__device__ __forceinline__ int rs_base(int lane) {
  int base = 0, n = N;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1, n >>= 1)
    if (n >= 2 && (lane & off)) base += n / 2;
  return base;
}

// Whether this lane writes the reduce-scatter result (one lane per distinct sum).
template <int N>
__device__ __forceinline__ bool rs_owner(int lane) {
  return N >= 32 || (lane & (32 / N - 1)) == 0;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}

struct Dims {
  int T, H, K, S;  // tokens, heads, state rows, tokens per stretch
};

// Stages q or k rows of a stretch: dst[s * K + r] = src[b, t0 + s, h, r].
__device__ __forceinline__ void stage_rows(float* dst, const float* src, const Dims& d, int b, int h, int t0, int n,
                                           int width) {
  for (int i = threadIdx.x; i < n * width; i += blockDim.x) {
    const int s = i / width, c = i - s * width;
    dst[i] = src[((static_cast<int64_t>(b) * d.T + t0 + s) * d.H + h) * width + c];
  }
}

__device__ __forceinline__ void stage_gates(float* sf, float* skeep, const float* f, const float* keep, const Dims& d,
                                            int b, int h, int t0, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    sf[i] = f[(static_cast<int64_t>(b) * d.T + t0 + i) * d.H + h];
    skeep[i] = keep ? keep[static_cast<int64_t>(b) * d.T + t0 + i] : 1.f;
  }
}

// z = tanh(hp W + k v) for one row; W row-major [V, V] in shared memory. The empty asm is a compiler barrier: without
// it the compiler hoists W's V² loop-invariant loads into registers across the time loop, which for V = 16 spills.
template <int V>
__device__ __forceinline__ void mix(float (&z)[V], const float (&hp)[V], const float* sw, float ks, const float* sv) {
  asm volatile("" ::: "memory");
#pragma unroll
  for (int j = 0; j < V; ++j) z[j] = ks * sv[j];
#pragma unroll
  for (int i = 0; i < V; ++i)
#pragma unroll
    for (int j = 0; j < V; ++j) z[j] = fmaf(hp[i], sw[i * V + j], z[j]);
#pragma unroll
  for (int j = 0; j < V; ++j) z[j] = fast_tanh(z[j]);
}

// acc[g] += the warp's sum of entries g·G .. g·G + G - 1 of the V×V outer product hpᵀ du, reduced G at a time so
// that only G products are live (G = min(32, V²)). A template recursion rather than a loop: unrolled by
// construction, so the products stay in registers.
template <int V, int G, int Group>
__device__ __forceinline__ void accumulate_outer(float (&acc)[V * V / G], const float (&hp)[V], const float (&du)[V],
                                                 int lane) {
  if constexpr (Group < V * V / G) {
    float o[G];
#pragma unroll
    for (int m = 0; m < G; ++m) o[m] = hp[(Group * G + m) / V] * du[(Group * G + m) % V];
    reduce_scatter<G>(o, lane);
    acc[Group] += o[0];
    accumulate_outer<V, G, Group + 1>(acc, hp, du, lane);
  }
}

template <int V>
__device__ __forceinline__ void load_row(float (&x)[V], const float* p) {
#pragma unroll
  for (int j = 0; j < V; j += 4) {
    const float4 u = *reinterpret_cast<const float4*>(p + j);
    x[j] = u.x, x[j + 1] = u.y, x[j + 2] = u.z, x[j + 3] = u.w;
  }
}

template <int V>
__device__ __forceinline__ void store_row(float* p, const float (&x)[V]) {
#pragma unroll
  for (int j = 0; j < V; j += 4) *reinterpret_cast<float4*>(p + j) = make_float4(x[j], x[j + 1], x[j + 2], x[j + 3]);
}

template <int V>
__global__ void __launch_bounds__(kMaxRows)
    forward_kernel(Dims d, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                   const float* __restrict__ f, const float* __restrict__ keep, const float* __restrict__ w,
                   const float* __restrict__ h0, float* __restrict__ y, float* __restrict__ h_last,
                   float* __restrict__ checkpoints) {
  extern __shared__ float smem[];
  const int K = d.K, S = d.S, nw = K / 32;
  const int bh = blockIdx.x, b = bh / d.H, h = bh - b * d.H, r = threadIdx.x, lane = r & 31, warp = r >> 5;
  float* sw = smem;
  float* sq = sw + V * V;
  float* sk = sq + S * K;
  float* sv = sk + S * K;
  float* sf = sv + S * V;
  float* skeep = sf + S;
  float* sy = skeep + S;
  for (int i = r; i < V * V; i += K) sw[i] = w[static_cast<int64_t>(h) * V * V + i];
  const int64_t row = static_cast<int64_t>(bh) * K + r, rows = static_cast<int64_t>(gridDim.x) * K;
  float hs[V];
  load_row(hs, h0 + row * V);
  for (int t0 = 0, c = 0; t0 < d.T; t0 += S, ++c) {
    const int n = min(S, d.T - t0);
    if (checkpoints) store_row(checkpoints + (c * rows + row) * V, hs);
    __syncthreads();  // the previous stretch's readers of the staging buffers are done
    stage_rows(sq, q, d, b, h, t0, n, K);
    stage_rows(sk, k, d, b, h, t0, n, K);
    stage_rows(sv, v, d, b, h, t0, n, V);
    stage_gates(sf, skeep, f, keep, d, b, h, t0, n);
    __syncthreads();
    for (int s = 0; s < n; ++s) {
      const float kp = skeep[s], fs = sf[s];
#pragma unroll
      for (int j = 0; j < V; ++j) hs[j] *= kp;
      float z[V];
      mix(z, hs, sw, sk[s * K + r], sv + s * V);
      const float qs = sq[s * K + r];
      float p[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        hs[j] = fs * hs[j] + (1.f - fs) * z[j];
        p[j] = qs * hs[j];
      }
      reduce_scatter<V>(p, lane);
      if (rs_owner<V>(lane)) sy[(s * nw + warp) * V + rs_base<V>(lane)] = p[0];
    }
    __syncthreads();
    for (int i = r; i < n * V; i += K) {
      const int s = i / V, j = i - s * V;
      float sum = 0.f;
      for (int u = 0; u < nw; ++u) sum += sy[(s * nw + u) * V + j];
      y[((static_cast<int64_t>(b) * d.T + t0 + s) * d.H + h) * V + j] = sum;
    }
  }
  store_row(h_last + row * V, hs);
}

template <int V>
__global__ void __launch_bounds__(kMaxRows)
    backward_kernel(Dims d, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    const float* __restrict__ f, const float* __restrict__ keep, const float* __restrict__ w,
                    const float* __restrict__ checkpoints, const float* __restrict__ dy,
                    const float* __restrict__ dh_last, float clip, float* __restrict__ scratch, float* __restrict__ dq,
                    float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ df, float* __restrict__ dw,
                    float* __restrict__ dh0) {
  extern __shared__ float smem[];
  constexpr int kG = V * V < 32 ? V * V : 32;  // outer-product values reduced per shuffle round
  constexpr int kGroups = V * V / kG;
  const int K = d.K, S = d.S, nw = K / 32;
  const int bh = blockIdx.x, b = bh / d.H, h = bh - b * d.H, r = threadIdx.x, lane = r & 31, warp = r >> 5;
  float* sw = smem;
  float* sq = sw + V * V;
  float* sk = sq + S * K;
  float* sv = sk + S * K;
  float* sdy = sv + S * V;
  float* sf = sdy + S * V;
  float* skeep = sf + S;
  float* sdv = skeep + S;
  float* sdf = sdv + S * nw * V;
  float* sdw = sdf + S * nw;
  for (int i = r; i < V * V; i += K) sw[i] = w[static_cast<int64_t>(h) * V * V + i];
  const int64_t row = static_cast<int64_t>(bh) * K + r, rows = static_cast<int64_t>(gridDim.x) * K;
  // scratch row s holds the state before token t0 + s of the current stretch (before any reset), s = 0..n.
  float* mine = scratch + static_cast<int64_t>(bh) * (S + 1) * K * V + static_cast<int64_t>(r) * V;
  const int64_t scratch_step = static_cast<int64_t>(K) * V;
  float dh[V], acc[kGroups];
  if (dh_last) {
    load_row(dh, dh_last + row * V);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) dh[j] = 0.f;
  }
#pragma unroll
  for (int g = 0; g < kGroups; ++g) acc[g] = 0.f;
  const int stretches = (d.T + S - 1) / S;
  for (int c = stretches - 1; c >= 0; --c) {
    const int t0 = c * S, n = min(S, d.T - t0);
    __syncthreads();  // the previous stretch's readers of the staging buffers are done
    stage_rows(sq, q, d, b, h, t0, n, K);
    stage_rows(sk, k, d, b, h, t0, n, K);
    stage_rows(sv, v, d, b, h, t0, n, V);
    if (dy) stage_rows(sdy, dy, d, b, h, t0, n, V);
    stage_gates(sf, skeep, f, keep, d, b, h, t0, n);
    __syncthreads();
    // Recompute the stretch's states from its checkpoint.
    float hs[V];
    load_row(hs, checkpoints + (c * rows + row) * V);
    store_row(mine, hs);
    for (int s = 0; s < n; ++s) {
      const float kp = skeep[s], fs = sf[s];
#pragma unroll
      for (int j = 0; j < V; ++j) hs[j] *= kp;
      float z[V];
      mix(z, hs, sw, sk[s * K + r], sv + s * V);
#pragma unroll
      for (int j = 0; j < V; ++j) hs[j] = fs * hs[j] + (1.f - fs) * z[j];
      store_row(mine + (s + 1) * scratch_step, hs);
    }
    // Backpropagation through time over the stretch, last token first.
    for (int s = n - 1; s >= 0; --s) {
      const int64_t tok = (static_cast<int64_t>(b) * d.T + t0 + s) * d.H + h;
      const float kp = skeep[s], fs = sf[s], ks = sk[s * K + r], qs = sq[s * K + r];
      float hp[V], ht[V], z[V];
      load_row(hp, mine + s * scratch_step);
      load_row(ht, mine + (s + 1) * scratch_step);
#pragma unroll
      for (int j = 0; j < V; ++j) hp[j] *= kp;
      mix(z, hp, sw, ks, sv + s * V);
      float dqs = 0.f;
      if (dy) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float g = sdy[s * V + j];
          dh[j] += qs * g;
          dqs = fmaf(ht[j], g, dqs);
        }
      }
      dq[tok * K + r] = dqs;
      if (clip > 0.f) {
#pragma unroll
        for (int j = 0; j < V; ++j) dh[j] = fminf(fmaxf(dh[j], -clip), clip);
      }
      float du[V], p[V], dks = 0.f, dfs = 0.f;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        du[j] = (1.f - fs) * dh[j] * (1.f - z[j] * z[j]);
        dks = fmaf(du[j], sv[s * V + j], dks);
        dfs = fmaf(dh[j], hp[j] - z[j], dfs);
        p[j] = du[j] * ks;
      }
      dk[tok * K + r] = dks;
      reduce_scatter<V>(p, lane);
      if (rs_owner<V>(lane)) sdv[(s * nw + warp) * V + rs_base<V>(lane)] = p[0];
      dfs = warp_sum(dfs);
      if (lane == 0) sdf[s * nw + warp] = dfs;
      accumulate_outer<V, kG, 0>(acc, hp, du, lane);  // dW += hpᵀ du
      // dH_{t-1} = keep · (f dH_t + du Wᵀ)
      float nd[V];
#pragma unroll
      for (int j = 0; j < V; ++j) nd[j] = fs * dh[j];
#pragma unroll
      for (int j = 0; j < V; ++j)
#pragma unroll
        for (int i = 0; i < V; ++i) nd[j] = fmaf(du[i], sw[j * V + i], nd[j]);
#pragma unroll
      for (int j = 0; j < V; ++j) dh[j] = kp * nd[j];
    }
    __syncthreads();
    for (int i = r; i < n * V; i += K) {
      const int s = i / V, j = i - s * V;
      float sum = 0.f;
      for (int u = 0; u < nw; ++u) sum += sdv[(s * nw + u) * V + j];
      dv[((static_cast<int64_t>(b) * d.T + t0 + s) * d.H + h) * V + j] = sum;
    }
    for (int i = r; i < n; i += K) {
      float sum = 0.f;
      for (int u = 0; u < nw; ++u) sum += sdf[i * nw + u];
      df[(static_cast<int64_t>(b) * d.T + t0 + i) * d.H + h] = sum;
    }
  }
  store_row(dh0 + row * V, dh);
  if (rs_owner<kG>(lane)) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) sdw[warp * V * V + g * kG + rs_base<kG>(lane)] = acc[g];
  }
  __syncthreads();
  for (int i = r; i < V * V; i += K) {
    float sum = 0.f;
    for (int u = 0; u < nw; ++u) sum += sdw[u * V * V + i];
    atomicAdd(dw + static_cast<int64_t>(h) * V * V + i, sum);  // the batch rows of a head meet here
  }
}

int64_t forward_smem(const M2rnnShape& s) {
  const int64_t K = s.k_dim, V = s.v_dim, S = s.every, nw = K / 32;
  return 4 * (V * V + 2 * S * K + S * V + 2 * S + S * nw * V);
}

std::string launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(e);
}

template <typename Kernel>
std::string prepare(Kernel kernel, int64_t smem) {
  if (smem > 227 * 1024)
    return "m2rnn: a stretch of this many tokens needs " + std::to_string(smem) +
           " bytes of shared memory (at most 232448)";
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess)
    return launch_error("m2rnn: cudaFuncSetAttribute");
  return {};
}

Dims dims(const M2rnnShape& s) {
  return {static_cast<int>(s.tokens), static_cast<int>(s.heads), static_cast<int>(s.k_dim), static_cast<int>(s.every)};
}

template <int V>
std::string forward_v(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                      const float* keep, const float* w, const float* h0, float* y, float* h_last, float* cps,
                      cudaStream_t stream) {
  const int64_t smem = forward_smem(s);
  if (auto e = prepare(forward_kernel<V>, smem); !e.empty()) return e;
  forward_kernel<V><<<static_cast<unsigned>(s.batch * s.heads), static_cast<unsigned>(s.k_dim), smem, stream>>>(
      dims(s), q, k, v, f, keep, w, h0, y, h_last, cps);
  return launch_error("m2rnn forward");
}

template <int V>
std::string backward_v(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                       const float* keep, const float* w, const float* cps, const float* dy, const float* dh_last,
                       float clip, float* scratch, float* dq, float* dk, float* dv, float* df, float* dw, float* dh0,
                       cudaStream_t stream) {
  const int64_t smem = m2rnn_backward_smem(s);
  if (auto e = prepare(backward_kernel<V>, smem); !e.empty()) return e;
  backward_kernel<V><<<static_cast<unsigned>(s.batch * s.heads), static_cast<unsigned>(s.k_dim), smem, stream>>>(
      dims(s), q, k, v, f, keep, w, cps, dy, dh_last, clip, scratch, dq, dk, dv, df, dw, dh0);
  return launch_error("m2rnn backward");
}

}  // namespace

bool m2rnn_supported(int64_t k_dim, int64_t v_dim) {
  return k_dim >= 32 && k_dim <= kMaxRows && k_dim % 32 == 0 &&
         (v_dim == 4 || v_dim == 8 || v_dim == 16 || v_dim == 32);
}

int64_t m2rnn_backward_smem(const M2rnnShape& s) {
  const int64_t K = s.k_dim, V = s.v_dim, S = s.every, nw = K / 32;
  return 4 * (V * V + 2 * S * K + 2 * S * V + 2 * S + S * nw * V + S * nw + nw * V * V);
}

std::string m2rnn_forward(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                          const float* keep, const float* w, const float* h0, float* y, float* h_last,
                          float* checkpoints, void* stream) {
  if (!m2rnn_supported(s.k_dim, s.v_dim)) return "m2rnn: no fused kernel for this state shape";
  auto st = static_cast<cudaStream_t>(stream);
  switch (s.v_dim) {
    case 4: return forward_v<4>(s, q, k, v, f, keep, w, h0, y, h_last, checkpoints, st);
    case 8: return forward_v<8>(s, q, k, v, f, keep, w, h0, y, h_last, checkpoints, st);
    case 16: return forward_v<16>(s, q, k, v, f, keep, w, h0, y, h_last, checkpoints, st);
    default: return forward_v<32>(s, q, k, v, f, keep, w, h0, y, h_last, checkpoints, st);
  }
}

std::string m2rnn_backward(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                           const float* keep, const float* w, const float* checkpoints, const float* dy,
                           const float* dh_last, float grad_clip, float* scratch, float* dq, float* dk, float* dv,
                           float* df, float* dw, float* dh0, void* stream) {
  if (!m2rnn_supported(s.k_dim, s.v_dim)) return "m2rnn: no fused kernel for this state shape";
  auto st = static_cast<cudaStream_t>(stream);
  switch (s.v_dim) {
    case 4:
      return backward_v<4>(s, q, k, v, f, keep, w, checkpoints, dy, dh_last, grad_clip, scratch, dq, dk, dv, df, dw,
                           dh0, st);
    case 8:
      return backward_v<8>(s, q, k, v, f, keep, w, checkpoints, dy, dh_last, grad_clip, scratch, dq, dk, dv, df, dw,
                           dh0, st);
    case 16:
      return backward_v<16>(s, q, k, v, f, keep, w, checkpoints, dy, dh_last, grad_clip, scratch, dq, dk, dv, df, dw,
                            dh0, st);
    default:
      return backward_v<32>(s, q, k, v, f, keep, w, checkpoints, dy, dh_last, grad_clip, scratch, dq, dk, dv, df, dw,
                            dh0, st);
  }
}

}  // namespace slm::ops::cuda
