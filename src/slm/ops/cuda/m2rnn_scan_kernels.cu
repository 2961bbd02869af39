// Fused M2RNN scan on sm_90: the whole sequence of one (batch row, head) in one CTA, its K×V state in registers.
// Two kernel families share that plan: the row-per-thread kernels described here (V = 4 and 32, or any V with
// SLM_M2RNN_KERNEL=rows) and, for V = 8 and 16, the tensor-core kernels further below (W in registers as mma
// fragments; see there why).
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
#include <cstdlib>
#include <string>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/m2rnn_scan_kernels.h"

namespace slm::ops::cuda {

namespace {

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

struct Dims {
  int T, H, K, S;  // tokens, heads, state rows, tokens per stretch
};

// Stages q or k rows of a stretch: dst[s * K + r] = src[b, t0 + s, h, r].
__device__ __forceinline__ void stage_rows(float* dst, const float* src, const Dims& d, int b, int h, int t0, int n,
                                           int width) {
#pragma unroll 4
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

// One stretch's inputs into shared memory, between the two barriers every stretch loop needs (the previous
// stretch's readers of the buffers are done before the writes; this stretch's readers wait for all of them): q, k
// [n, K], v and, in the backward, dy [n, V] (dy null: not staged), the forget gates and the document keeps [n].
__device__ __forceinline__ void stage_stretch(float* sq, float* sk, float* sv, float* sdy, float* sf, float* skeep,
                                              const float* q, const float* k, const float* v, const float* dy,
                                              const float* f, const float* keep, const Dims& d, int b, int h, int t0,
                                              int n, int K, int V) {
  __syncthreads();
  stage_rows(sq, q, d, b, h, t0, n, K);
  stage_rows(sk, k, d, b, h, t0, n, K);
  stage_rows(sv, v, d, b, h, t0, n, V);
  if (dy) stage_rows(sdy, dy, d, b, h, t0, n, V);
  stage_gates(sf, skeep, f, keep, d, b, h, t0, n);
  __syncthreads();
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
    stage_stretch(sq, sk, sv, nullptr, sf, skeep, q, k, v, nullptr, f, keep, d, b, h, t0, n, K, V);
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
    stage_stretch(sq, sk, sv, sdy, sf, skeep, q, k, v, dy, f, keep, d, b, h, t0, n, K, V);
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

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core kernels for V = 8 and 16 (the shapes the models use).
//
// Why: in the kernels above every step reads all of W from shared memory once per V×V product (one 16-byte
// broadcast per 4 FMAs: the backward does three such products per step, 768 broadcasts per warp and token), and
// dW costs 248 shuffles per token. Both go through the SM's shared-memory/shuffle data path (128 bytes per clock),
// which is what bound those kernels (~1150 data-path clocks per warp and token in the backward). Here a warp's 32
// state rows form two 16×V tiles of an mma.m16n8k8 accumulator, W (and Wᵀ for the backward) live in registers as
// B fragments for the whole sequence, and the V×V products run on the tensor cores.
//
// Layout: lane (g = lane / 4, t = lane % 4) holds x[ri][ci] = H[8 ri + g][8 (ci / 2) + 2 t + ci % 2] of its warp's
// 32 rows, ri < 4, ci < V / 4 — exactly the accumulator fragments of the tiles (rows 16 mt.., cols 8 nt..). Reading
// the same registers as A fragments needs the k index of a k-step permuted (k ↔ column 2k, k + 4 ↔ 2k + 1); W's
// rows are permuted the same way when its B fragments are built, so no data moves between lanes.
//
// Numerics: tensor cores multiply TF32 (11 significant bits), so every operand is split x = hi + lo (both TF32,
// lo = x - hi rounded) and a product is hi·hi + hi·lo + lo·hi: the dropped lo·lo and the rounding of lo are
// ~2^-22 relative, near FP32's own rounding. The sums run in the tensor core's FP32 accumulator (another summation
// order than the sequential FMAs above). Everything else (tanh, the convex mix, the clip, the resets, dW) is FP32.
// A float64 emulation of the test's hardest case (T 150, no clip, expansive W; rounding grows along the sequence)
// put these products within 0.5-7x of plain FP32's error on every output and gradient; adding lo·lo did not help.
constexpr int kMmaRowsPerWarp = 32;

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}

// d += a b for one m16n8k8 TF32 tile.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Column of entry ci of a lane's fragment row (and of reduce-scatter result index ci below).
__device__ __forceinline__ int frag_col(int ci, int t) {
  return 8 * (ci >> 1) + 2 * t + (ci & 1);
}

// B fragments of W (or of Wᵀ) for x W (x Wᵀ): b[ks][nt][e] = M[8 ks + 2 t + e][8 nt + g] with M = W (M = Wᵀ).
template <int V>
struct WFrag {
  uint32_t hi[V / 8][V / 8][2], lo[V / 8][V / 8][2];
};

template <int V>
__device__ __forceinline__ WFrag<V> load_wfrag(const float* sw, bool transpose, int g, int t) {
  WFrag<V> w;
#pragma unroll
  for (int ks = 0; ks < V / 8; ++ks)
#pragma unroll
    for (int nt = 0; nt < V / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 8 * ks + 2 * t + e, j = 8 * nt + g;
        split_tf32(transpose ? sw[j * V + i] : sw[i * V + j], w.hi[ks][nt][e], w.lo[ks][nt][e]);
      }
  return w;
}

// acc += x M for the warp's 32 rows (M = W or Wᵀ as held by w).
template <int V>
__device__ __forceinline__ void mma_mix(float (&acc)[4][V / 4], const float (&x)[4][V / 4], const WFrag<V>& w) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int ks = 0; ks < V / 8; ++ks) {
      uint32_t ah[4], al[4];
      split_tf32(x[2 * mt][2 * ks], ah[0], al[0]);
      split_tf32(x[2 * mt + 1][2 * ks], ah[1], al[1]);
      split_tf32(x[2 * mt][2 * ks + 1], ah[2], al[2]);
      split_tf32(x[2 * mt + 1][2 * ks + 1], ah[3], al[3]);
#pragma unroll
      for (int nt = 0; nt < V / 8; ++nt) {
        float d[4] = {acc[2 * mt][2 * nt], acc[2 * mt][2 * nt + 1], acc[2 * mt + 1][2 * nt],
                      acc[2 * mt + 1][2 * nt + 1]};
        // Small terms first, so that they meet the accumulator while it is small.
        mma_tf32(d, al, w.hi[ks][nt]);
        mma_tf32(d, ah, w.lo[ks][nt]);
        mma_tf32(d, ah, w.hi[ks][nt]);
        acc[2 * mt][2 * nt] = d[0], acc[2 * mt][2 * nt + 1] = d[1];
        acc[2 * mt + 1][2 * nt] = d[2], acc[2 * mt + 1][2 * nt + 1] = d[3];
      }
    }
}

// Reduce-scatter as reduce_scatter above, confined to lane bits OFF, OFF / 2, ..., LAST: x[0] ends with the sum
// over those bits of index rs_index<N, OFF, LAST>(lane); lanes whose rs_copy_bits are set hold copies.
template <int N, int OFF, int LAST, int A>
__device__ __forceinline__ void reduce_scatter_bits(float (&x)[A], int lane) {
  if constexpr (OFF >= LAST) {
    if constexpr (N >= 2) {
      constexpr int kHalf = N / 2;
      const bool upper = lane & OFF;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? x[i] : x[i + kHalf];
        const float keep = upper ? x[i + kHalf] : x[i];
        x[i] = keep + __shfl_xor_sync(kFullMask, send, OFF);
      }
      reduce_scatter_bits<kHalf, OFF / 2, LAST>(x, lane);
    } else {
      x[0] += __shfl_xor_sync(kFullMask, x[0], OFF);
      reduce_scatter_bits<1, OFF / 2, LAST>(x, lane);
    }
  }
}

template <int N, int OFF, int LAST>
__device__ __forceinline__ int rs_index(int lane) {
  int base = 0, n = N;
#pragma unroll
  for (int off = OFF; off >= LAST; off >>= 1, n >>= 1)
    if (n >= 2 && (lane & off)) base += n / 2;
  return base;
}

template <int N, int OFF, int LAST>
__host__ __device__ constexpr int rs_copy_bits() {
  int mask = 0, n = N;
  for (int off = OFF; off >= LAST; off >>= 1, n >>= 1)
    if (n < 2) mask |= off;
  return mask;
}

// Sums over the warp's rows (lane bits of g: 16, 8, 4) of per-column partials p[ci]; the owning lane gets column
// frag_col(rs_index, t).
template <int V>
__device__ __forceinline__ void sum_rows(float (&p)[V / 4], int lane, float* out) {
  reduce_scatter_bits<V / 4, 16, 4>(p, lane);
  if ((lane & rs_copy_bits<V / 4, 16, 4>()) == 0) out[frag_col(rs_index<V / 4, 16, 4>(lane), lane & 3)] = p[0];
}

// Sums over a row's columns (lane bits of t: 2, 1) of per-row partials p[ri]; lane (g, t) gets row 8 t + g.
__device__ __forceinline__ float sum_cols(float (&p)[4], int lane) {
  reduce_scatter_bits<4, 2, 1>(p, lane);
  return p[0];
}

// A row-major [K, V] state (h0, checkpoints, gradients) to and from the fragment layout; rows of this warp.
template <int V>
__device__ __forceinline__ void load_frag(float (&x)[4][V / 4], const float* base, int g, int t) {
#pragma unroll
  for (int ri = 0; ri < 4; ++ri)
#pragma unroll
    for (int nt = 0; nt < V / 8; ++nt) {
      const float2 u = *reinterpret_cast<const float2*>(base + (8 * ri + g) * V + 8 * nt + 2 * t);
      x[ri][2 * nt] = u.x, x[ri][2 * nt + 1] = u.y;
    }
}

template <int V>
__device__ __forceinline__ void store_frag(float* base, const float (&x)[4][V / 4], int g, int t) {
#pragma unroll
  for (int ri = 0; ri < 4; ++ri)
#pragma unroll
    for (int nt = 0; nt < V / 8; ++nt)
      *reinterpret_cast<float2*>(base + (8 * ri + g) * V + 8 * nt + 2 * t) =
          make_float2(x[ri][2 * nt], x[ri][2 * nt + 1]);
}

// The backward's per-lane scratch: a lane's V floats of a state, contiguous (coalesced 16-byte accesses).
template <int V>
__device__ __forceinline__ void store_lane(float* p, const float (&x)[4][V / 4]) {
  constexpr int C = V / 4;
#pragma unroll
  for (int e = 0; e < V; e += 4)
    *reinterpret_cast<float4*>(p + e) = make_float4(x[e / C][e % C], x[(e + 1) / C][(e + 1) % C],
                                                    x[(e + 2) / C][(e + 2) % C], x[(e + 3) / C][(e + 3) % C]);
}

template <int V>
__device__ __forceinline__ void load_lane(float (&x)[4][V / 4], const float* p) {
  constexpr int C = V / 4;
#pragma unroll
  for (int e = 0; e < V; e += 4) {
    const float4 u = *reinterpret_cast<const float4*>(p + e);
    x[e / C][e % C] = u.x, x[(e + 1) / C][(e + 1) % C] = u.y;
    x[(e + 2) / C][(e + 2) % C] = u.z, x[(e + 3) / C][(e + 3) % C] = u.w;
  }
}

// z = tanh(x W + k vᵀ) for the warp's rows (x already reset), kr the lane's rows of k, sv the token's v.
template <int V>
__device__ __forceinline__ void mma_tanh(float (&z)[4][V / 4], const float (&x)[4][V / 4], const WFrag<V>& w,
                                         const float (&kr)[4], const float* sv, int t) {
  float vc[V / 4];
#pragma unroll
  for (int nt = 0; nt < V / 8; ++nt) {
    const float2 u = *reinterpret_cast<const float2*>(sv + 8 * nt + 2 * t);
    vc[2 * nt] = u.x, vc[2 * nt + 1] = u.y;
  }
#pragma unroll
  for (int ri = 0; ri < 4; ++ri)
#pragma unroll
    for (int ci = 0; ci < V / 4; ++ci) z[ri][ci] = kr[ri] * vc[ci];
  mma_mix<V>(z, x, w);
#pragma unroll
  for (int ri = 0; ri < 4; ++ri)
#pragma unroll
    for (int ci = 0; ci < V / 4; ++ci) z[ri][ci] = fast_tanh(z[ri][ci]);
}

// One step H = f H + (1 - f) tanh(H W + k vᵀ) of the warp's rows (H already reset).
template <int V>
__device__ __forceinline__ void mma_step(float (&x)[4][V / 4], const WFrag<V>& w, const float (&kr)[4], const float* sv,
                                         float fs, int t) {
  float z[4][V / 4];
  mma_tanh<V>(z, x, w, kr, sv, t);
#pragma unroll
  for (int ri = 0; ri < 4; ++ri)
#pragma unroll
    for (int ci = 0; ci < V / 4; ++ci) x[ri][ci] = fs * x[ri][ci] + (1.f - fs) * z[ri][ci];
}

template <int V>
__global__ void __launch_bounds__(kMaxRows)
    forward_mma_kernel(Dims d, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ f, const float* __restrict__ keep, const float* __restrict__ w,
                       const float* __restrict__ h0, float* __restrict__ y, float* __restrict__ h_last,
                       float* __restrict__ checkpoints) {
  extern __shared__ __align__(16) float smem_mma[];
  const int K = d.K, S = d.S, nw = K / 32;
  const int bh = blockIdx.x, b = bh / d.H, h = bh - b * d.H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, row0 = warp * kMmaRowsPerWarp;
  float* sw = smem_mma;
  float* sq = sw + V * V;
  float* sk = sq + S * K;
  float* sv = sk + S * K;
  float* sf = sv + S * V;
  float* skeep = sf + S;
  float* sy = skeep + S;
  for (int i = threadIdx.x; i < V * V; i += K) sw[i] = w[static_cast<int64_t>(h) * V * V + i];
  __syncthreads();
  const WFrag<V> wf = load_wfrag<V>(sw, false, g, t);
  const int64_t state = static_cast<int64_t>(bh) * K * V + row0 * V, states = static_cast<int64_t>(gridDim.x) * K * V;
  float x[4][V / 4];
  load_frag<V>(x, h0 + state, g, t);
  for (int t0 = 0, c = 0; t0 < d.T; t0 += S, ++c) {
    const int n = min(S, d.T - t0);
    if (checkpoints) store_frag<V>(checkpoints + c * states + state, x, g, t);
    stage_stretch(sq, sk, sv, nullptr, sf, skeep, q, k, v, nullptr, f, keep, d, b, h, t0, n, K, V);
    for (int s = 0; s < n; ++s) {
      const float kp = skeep[s], fs = sf[s];
      float kr[4], qr[4];
#pragma unroll
      for (int ri = 0; ri < 4; ++ri) {
        kr[ri] = sk[s * K + row0 + 8 * ri + g];
        qr[ri] = sq[s * K + row0 + 8 * ri + g];
#pragma unroll
        for (int ci = 0; ci < V / 4; ++ci) x[ri][ci] *= kp;
      }
      mma_step<V>(x, wf, kr, sv + s * V, fs, t);
      float p[V / 4];
#pragma unroll
      for (int ci = 0; ci < V / 4; ++ci) {
        p[ci] = 0.f;
#pragma unroll
        for (int ri = 0; ri < 4; ++ri) p[ci] = fmaf(qr[ri], x[ri][ci], p[ci]);
      }
      sum_rows<V>(p, lane, sy + (s * nw + warp) * V);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n * V; i += K) {
      const int s = i / V, j = i - s * V;
      float sum = 0.f;
      for (int u = 0; u < nw; ++u) sum += sy[(s * nw + u) * V + j];
      y[((static_cast<int64_t>(b) * d.T + t0 + s) * d.H + h) * V + j] = sum;
    }
  }
  store_frag<V>(h_last + state, x, g, t);
}

// dW = Σ hpᵀ du as a register-tiled GEMM over the warp's rows of each token, one 16-row m-tile at a time (so that
// the staging, 2 KiB per warp for V = 16, keeps four 2-warp CTAs per SM): the lanes' hp and du rows go to a
// per-warp shared buffer (row-major, columns XOR-swizzled by 8 on every other row pair for V = 16 so that the
// 8-byte stores of a half-warp hit all 32 banks), and lane (tile, part) adds a 4×4 tile of dW over the rows
// ≡ part mod kParts: 16 FMAs per two 16-byte loads instead of ~31 shuffles per 32 products.
template <int V>
struct DwTiles {
  static constexpr int kRows = 16, kTiles = (V / 4) * (V / 4), kParts = 32 / kTiles, kRowsPerLane = kRows / kParts;
};

template <int V>
__device__ __forceinline__ int dw_swizzle(int row) {
  return V == 16 ? 8 * ((row >> 1) & 1) : 0;
}

// Rows 16 mt .. 16 mt + 15 of the warp (fragment rows ri = 2 mt, 2 mt + 1) to buf.
template <int V>
__device__ __forceinline__ void stage_dw_rows(float* buf, const float (&x)[4][V / 4], int mt, int g, int t) {
#pragma unroll
  for (int h8 = 0; h8 < 2; ++h8) {
    const int ri = 2 * mt + h8, row = 8 * h8 + g;
#pragma unroll
    for (int nt = 0; nt < V / 8; ++nt)
      *reinterpret_cast<float2*>(buf + row * V + ((8 * nt + 2 * t) ^ dw_swizzle<V>(row))) =
          make_float2(x[ri][2 * nt], x[ri][2 * nt + 1]);
  }
}

template <int V>
__device__ __forceinline__ void accumulate_dw(float (&acc)[4][4], const float* shp, const float* sdu, int lane) {
  using D = DwTiles<V>;
  const int tile = lane % D::kTiles, part = lane / D::kTiles, i0 = 4 * (tile / (V / 4)), j0 = 4 * (tile % (V / 4));
#pragma unroll
  for (int kk = 0; kk < D::kRowsPerLane; ++kk) {
    const int row = kk * D::kParts + part;
    const float4 a = *reinterpret_cast<const float4*>(shp + row * V + (i0 ^ dw_swizzle<V>(row)));
    const float4 u = *reinterpret_cast<const float4*>(sdu + row * V + (j0 ^ dw_swizzle<V>(row)));
    const float av[4] = {a.x, a.y, a.z, a.w}, uv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) acc[ii][jj] = fmaf(av[ii], uv[jj], acc[ii][jj]);
  }
}

template <int V>
__global__ void __launch_bounds__(kMaxRows)
    backward_mma_kernel(Dims d, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                        const float* __restrict__ f, const float* __restrict__ keep, const float* __restrict__ w,
                        const float* __restrict__ checkpoints, const float* __restrict__ dy,
                        const float* __restrict__ dh_last, float clip, float* __restrict__ scratch,
                        float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv, float* __restrict__ df,
                        float* __restrict__ dw, float* __restrict__ dh0) {
  extern __shared__ __align__(16) float smem_mma[];
  const int K = d.K, S = d.S, nw = K / 32;
  const int bh = blockIdx.x, b = bh / d.H, h = bh - b * d.H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, row0 = warp * kMmaRowsPerWarp;
  float* sw = smem_mma;
  constexpr int kStage = 2 * DwTiles<V>::kRows * V;  // a warp's dW staging: 16 hp rows, then 16 du rows
  float* shp = sw + V * V + warp * kStage;
  float* sdu = shp + DwTiles<V>::kRows * V;
  // The per-warp dW partials at the end reuse the staging (nw V² <= nw kStage floats): the last stretch's
  // __syncthreads orders them after every warp's last reads.
  float* sdw = sw + V * V;
  float* sq = sw + V * V + nw * kStage;
  float* sk = sq + S * K;
  float* sv = sk + S * K;
  float* sdy = sv + S * V;
  float* sf = sdy + S * V;
  float* skeep = sf + S;
  float* sdv = skeep + S;
  float* sdf = sdv + S * nw * V;
  for (int i = threadIdx.x; i < V * V; i += K) sw[i] = w[static_cast<int64_t>(h) * V * V + i];
  __syncthreads();
  const WFrag<V> wf = load_wfrag<V>(sw, false, g, t), wtf = load_wfrag<V>(sw, true, g, t);
  const int64_t state = static_cast<int64_t>(bh) * K * V + row0 * V, states = static_cast<int64_t>(gridDim.x) * K * V;
  // scratch slot s holds the state before token t0 + s of the current stretch (before any reset), s = 0..n, in the
  // per-lane layout.
  float* mine = scratch + static_cast<int64_t>(bh) * (S + 1) * K * V + static_cast<int64_t>(threadIdx.x) * V;
  const int64_t slot = static_cast<int64_t>(K) * V;
  float dh[4][V / 4], acc[4][4];
  if (dh_last) {
    load_frag<V>(dh, dh_last + state, g, t);
  } else {
#pragma unroll
    for (int ri = 0; ri < 4; ++ri)
#pragma unroll
      for (int ci = 0; ci < V / 4; ++ci) dh[ri][ci] = 0.f;
  }
#pragma unroll
  for (int ii = 0; ii < 4; ++ii)
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) acc[ii][jj] = 0.f;
  const int stretches = (d.T + S - 1) / S;
  for (int c = stretches - 1; c >= 0; --c) {
    const int t0 = c * S, n = min(S, d.T - t0);
    stage_stretch(sq, sk, sv, sdy, sf, skeep, q, k, v, dy, f, keep, d, b, h, t0, n, K, V);
    // Recompute the stretch's states from its checkpoint; `cur` ends as the state after the stretch.
    float cur[4][V / 4];
    load_frag<V>(cur, checkpoints + c * states + state, g, t);
    store_lane<V>(mine, cur);
    for (int s = 0; s < n; ++s) {
      const float kp = skeep[s];
      float kr[4];
#pragma unroll
      for (int ri = 0; ri < 4; ++ri) {
        kr[ri] = sk[s * K + row0 + 8 * ri + g];
#pragma unroll
        for (int ci = 0; ci < V / 4; ++ci) cur[ri][ci] *= kp;
      }
      mma_step<V>(cur, wf, kr, sv + s * V, sf[s], t);
      if (s + 1 < n) store_lane<V>(mine + (s + 1) * slot, cur);  // the last state stays in registers
    }
    // Backpropagation through time, last token first. `cur` holds the state after token s (for dq), `prev` the
    // state before it (loaded one step ahead so that the scratch latency overlaps a step's work).
    float prev[4][V / 4];
    load_lane<V>(prev, mine + (n - 1) * slot);
    for (int s = n - 1; s >= 0; --s) {
      float next[4][V / 4];
      if (s > 0) load_lane<V>(next, mine + (s - 1) * slot);
      const int64_t tok = (static_cast<int64_t>(b) * d.T + t0 + s) * d.H + h;
      const float kp = skeep[s], fs = sf[s];
      float kr[4], qr[4], hp[4][V / 4];
#pragma unroll
      for (int ri = 0; ri < 4; ++ri) {
        kr[ri] = sk[s * K + row0 + 8 * ri + g];
        qr[ri] = sq[s * K + row0 + 8 * ri + g];
#pragma unroll
        for (int ci = 0; ci < V / 4; ++ci) hp[ri][ci] = prev[ri][ci] * kp;
      }
      // z of this step again: keeping the tanh outputs would double the scratch traffic.
      float z[4][V / 4];
      mma_tanh<V>(z, hp, wf, kr, sv + s * V, t);
      float pq[4] = {0.f, 0.f, 0.f, 0.f};
      if (dy) {
        float gc[V / 4];
#pragma unroll
        for (int nt = 0; nt < V / 8; ++nt) {
          const float2 u = *reinterpret_cast<const float2*>(sdy + s * V + 8 * nt + 2 * t);
          gc[2 * nt] = u.x, gc[2 * nt + 1] = u.y;
        }
#pragma unroll
        for (int ri = 0; ri < 4; ++ri)
#pragma unroll
          for (int ci = 0; ci < V / 4; ++ci) {
            dh[ri][ci] += qr[ri] * gc[ci];
            pq[ri] = fmaf(cur[ri][ci], gc[ci], pq[ri]);
          }
      }
      dq[tok * K + row0 + 8 * t + g] = sum_cols(pq, lane);
      if (clip > 0.f) {
#pragma unroll
        for (int ri = 0; ri < 4; ++ri)
#pragma unroll
          for (int ci = 0; ci < V / 4; ++ci) dh[ri][ci] = fminf(fmaxf(dh[ri][ci], -clip), clip);
      }
      float vc[V / 4];
#pragma unroll
      for (int nt = 0; nt < V / 8; ++nt) {
        const float2 u = *reinterpret_cast<const float2*>(sv + s * V + 8 * nt + 2 * t);
        vc[2 * nt] = u.x, vc[2 * nt + 1] = u.y;
      }
      float du[4][V / 4], pk[4] = {0.f, 0.f, 0.f, 0.f}, pv[V / 4], dfs = 0.f;
#pragma unroll
      for (int ci = 0; ci < V / 4; ++ci) pv[ci] = 0.f;
#pragma unroll
      for (int ri = 0; ri < 4; ++ri)
#pragma unroll
        for (int ci = 0; ci < V / 4; ++ci) {
          du[ri][ci] = (1.f - fs) * dh[ri][ci] * (1.f - z[ri][ci] * z[ri][ci]);
          pk[ri] = fmaf(du[ri][ci], vc[ci], pk[ri]);
          pv[ci] = fmaf(du[ri][ci], kr[ri], pv[ci]);
          dfs = fmaf(dh[ri][ci], hp[ri][ci] - z[ri][ci], dfs);
        }
      dk[tok * K + row0 + 8 * t + g] = sum_cols(pk, lane);
      sum_rows<V>(pv, lane, sdv + (s * nw + warp) * V);
      dfs = warp_sum(dfs);
      if (lane == 0) sdf[s * nw + warp] = dfs;
      // dW += hpᵀ du over the warp's rows.
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        stage_dw_rows<V>(shp, hp, mt, g, t);
        stage_dw_rows<V>(sdu, du, mt, g, t);
        __syncwarp();
        accumulate_dw<V>(acc, shp, sdu, lane);
        __syncwarp();  // read before the next rows overwrite
      }
      // dH_{t-1} = keep · (f dH_t + du Wᵀ)
#pragma unroll
      for (int ri = 0; ri < 4; ++ri)
#pragma unroll
        for (int ci = 0; ci < V / 4; ++ci) dh[ri][ci] *= fs;
      mma_mix<V>(dh, du, wtf);
#pragma unroll
      for (int ri = 0; ri < 4; ++ri)
#pragma unroll
        for (int ci = 0; ci < V / 4; ++ci) {
          dh[ri][ci] *= kp;
          cur[ri][ci] = prev[ri][ci];
          if (s > 0) prev[ri][ci] = next[ri][ci];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n * V; i += K) {
      const int s = i / V, j = i - s * V;
      float sum = 0.f;
      for (int u = 0; u < nw; ++u) sum += sdv[(s * nw + u) * V + j];
      dv[((static_cast<int64_t>(b) * d.T + t0 + s) * d.H + h) * V + j] = sum;
    }
    for (int i = threadIdx.x; i < n; i += K) {
      float sum = 0.f;
      for (int u = 0; u < nw; ++u) sum += sdf[i * nw + u];
      df[(static_cast<int64_t>(b) * d.T + t0 + i) * d.H + h] = sum;
    }
  }
  store_frag<V>(dh0 + state, dh, g, t);
  // The lanes that share a tile (different row parts) meet, then the warps in shared memory.
  using D = DwTiles<V>;
#pragma unroll
  for (int off = D::kTiles; off < 32; off <<= 1)
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) acc[ii][jj] += __shfl_xor_sync(kFullMask, acc[ii][jj], off);
  if (lane < D::kTiles) {
    const int i0 = 4 * (lane / (V / 4)), j0 = 4 * (lane % (V / 4));
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) sdw[warp * V * V + (i0 + ii) * V + j0 + jj] = acc[ii][jj];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < V * V; i += K) {
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

int64_t backward_smem_rows(const M2rnnShape& s) {
  const int64_t K = s.k_dim, V = s.v_dim, S = s.every, nw = K / 32;
  return 4 * (V * V + 2 * S * K + 2 * S * V + 2 * S + S * nw * V + S * nw + nw * V * V);
}

// The tensor-core kernels hold each warp's dW staging (hp and du of 16 rows) in place of its dW partials.
int64_t backward_smem_mma(const M2rnnShape& s) {
  const int64_t nw = s.k_dim / 32, V = s.v_dim;
  return backward_smem_rows(s) + 4 * nw * (2 * 16 * V - V * V);
}

// Which kernels run: the tensor-core ones for V = 8 and 16 unless SLM_M2RNN_KERNEL=rows asks for the
// row-per-thread ones (kept for V = 4 and 32, and for comparing the two in bench/m2rnn_bench).
bool use_mma(const M2rnnShape& s) {
  static const bool rows = [] {
    const char* e = std::getenv("SLM_M2RNN_KERNEL");
    return e && std::string(e) == "rows";
  }();
  return !rows && (s.v_dim == 8 || s.v_dim == 16);
}

template <int V>
std::string forward_v(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                      const float* keep, const float* w, const float* h0, float* y, float* h_last, float* cps,
                      cudaStream_t stream) {
  const int64_t smem = forward_smem(s);
  const unsigned grid = static_cast<unsigned>(s.batch * s.heads), block = static_cast<unsigned>(s.k_dim);
  if constexpr (V == 8 || V == 16) {
    if (use_mma(s)) {
      if (auto e = prepare(forward_mma_kernel<V>, smem); !e.empty()) return e;
      forward_mma_kernel<V><<<grid, block, smem, stream>>>(dims(s), q, k, v, f, keep, w, h0, y, h_last, cps);
      return launch_error("m2rnn forward");
    }
  }
  if (auto e = prepare(forward_kernel<V>, smem); !e.empty()) return e;
  forward_kernel<V><<<grid, block, smem, stream>>>(dims(s), q, k, v, f, keep, w, h0, y, h_last, cps);
  return launch_error("m2rnn forward");
}

template <int V>
std::string backward_v(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                       const float* keep, const float* w, const float* cps, const float* dy, const float* dh_last,
                       float clip, float* scratch, float* dq, float* dk, float* dv, float* df, float* dw, float* dh0,
                       cudaStream_t stream) {
  const int64_t smem = m2rnn_backward_smem(s);
  const unsigned grid = static_cast<unsigned>(s.batch * s.heads), block = static_cast<unsigned>(s.k_dim);
  if constexpr (V == 8 || V == 16) {
    if (use_mma(s)) {
      if (auto e = prepare(backward_mma_kernel<V>, smem); !e.empty()) return e;
      backward_mma_kernel<V><<<grid, block, smem, stream>>>(dims(s), q, k, v, f, keep, w, cps, dy, dh_last, clip,
                                                            scratch, dq, dk, dv, df, dw, dh0);
      return launch_error("m2rnn backward");
    }
  }
  if (auto e = prepare(backward_kernel<V>, smem); !e.empty()) return e;
  backward_kernel<V><<<grid, block, smem, stream>>>(dims(s), q, k, v, f, keep, w, cps, dy, dh_last, clip, scratch, dq,
                                                    dk, dv, df, dw, dh0);
  return launch_error("m2rnn backward");
}

}  // namespace

bool m2rnn_supported(int64_t k_dim, int64_t v_dim) {
  return k_dim >= 32 && k_dim <= kMaxRows && k_dim % 32 == 0 &&
         (v_dim == 4 || v_dim == 8 || v_dim == 16 || v_dim == 32);
}

int64_t m2rnn_backward_smem(const M2rnnShape& s) {
  return use_mma(s) ? backward_smem_mma(s) : backward_smem_rows(s);
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
