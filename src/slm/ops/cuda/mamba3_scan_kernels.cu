// Fused Mamba-3 chunked scan (SISO, and MIMO of rank R = 2 or 4) on sm_90: one CTA per (batch row, head) walks the
// sequence in chunks of 32 rows with the head's P×N state in registers, as tensor-core accumulator tiles. A row is a
// (token, rank) pair: SISO chunks are 32 tokens, MIMO ones 32 / R tokens of R rows each (row j: token j / R, rank
// j % R), so every table and loop below stays 32 wide whatever the rank.
//
// Why this shape: the libtorch chunked form (ops/mamba3_scan.cpp) is a few batched matmuls between long chains of
// elementwise kernels on FP32 temporaries ([B, T, H, N] rotated keys broadcast from the groups, [B, H, chunks, Q, Q]
// decay masks), which is where the layer's time went. Here the keys are built in shared memory from the groups' normed
// B/C (bias and rotation applied on the fly), every temporary is chunk-sized, and nothing but the outputs, the
// gradients and one state per chunk touches global memory.
//
// Per chunk (rows t, s in [0, 32), τ(t) the token of row t; scalars by one warp, lane = row, each row holding its
// token's, the decay sums as warp scans to which only a token's rank-0 row contributes):
//   cum_t = Σ_{u≤τ(t)} a_u;  cnt_t = documents started in the chunk up to τ(t) (M[t,s] = [cnt_t == cnt_s]: no start
//   in (τ(s), τ(t)]);  L[t,s] = σ_s e^{cum_t - cum_s} M[t,s] (τ(s) < τ(t)), γ_t (τ(s) = τ(t), every rank pair), 0
//   (τ(s) > τ(t));  e_t = e^{cum_t} [cnt_t == 0];  w_s = σ_s e^{cum_31 - cum_s} M[31,s];  E = e^{cum_31} [cnt_31 == 0]
//   y_t = Σ_s L[t,s] (q_t·k_s) v_s + e_t H q_t + D v_t,       H ← E H + Σ_s w_s v_s k_sᵀ
// which is the reference's recurrence S_t = α_t S_{t-1} + β_t Σ_r v_{t-1,r}k_{t-1,r}ᵀ + γ_t Σ_r v_{t,r}k_{t,r}ᵀ
// regrouped (σ_s = γ_s + ε_{s+1} collects both terms that v_s k_sᵀ enters with), v_{t,r} = x_t ⊙ mimo_x[h,r] (SISO:
// v = x). The gradient of a token's scalars sums its rows'; dx sums the ranks' dv ⊙ mimo_x. The chunk's matrix
// products (q Hᵀ, the state update; in the backward q kᵀ, dy vᵀ, k dHᵀ, dy H, v dH and the dH update) run as 3xTF32
// WMMA tiles (mma_tile), each warp holding some 16×16 tiles of the state; the rest (decay tables, token and value
// gradients, rotations) on the CUDA cores.
//
// The rotary phase runs inside too: per chunk each warp takes some of the S angles (lane = row) and forms
// φ_t = φ_{t-1} + Δ_t θ_t as a warp scan segmented at document starts, carried across chunks in [0, 2π). The keys and
// queries are rotated on the reference's pairs: interleaved (2i, 2i+1) for SISO, half-split (i, i + N/2) for MIMO.
//
// Backward: the chunks in reverse from the saved chunk states and phases, dH in accumulator tiles (and shared memory,
// for the products that read it), the exact gradients of the expressions above, the rotation undone per pair. FP32
// throughout (3xTF32 products stay within a few FP32 roundings). The backward's ~200 KB of shared memory (MIMO: 9 KB
// more at P 64 for the ranks' dv) leaves one CTA per SM, so it runs 16 warps where the phases are long enough to use
// them (backward_pn).
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/mamba3_scan_kernels.h"

namespace slm::ops::cuda {

namespace {

constexpr int kQ = 32;         // tokens per chunk: one warp's lanes, so the chunk's decay sums are warp scans
constexpr int kQS = kQ + 1;    // row stride of the forward's Q×Q table (column reads stay conflict-free)
constexpr int kQW = kQ + 4;    // row stride of the backward's Q×Q tables, which the tensor cores write
constexpr int kThreads = 256;  // forward; two CTAs per SM
constexpr int kWarps = kThreads / 32;
constexpr float kTwoPi = 6.283185307179586f;

struct Dims {
  int T, H, G, S, nc;
};

// Shared-memory strides for a head of P×N. Token layout: 8 threads per token, float4 groups (jj * 8 + ng) * 4,
// jj < N / 32 (a warp's 128-bit reads of one token's row hit consecutive addresses).
template <int P, int N>
struct Layout {
  static constexpr int NG = N / 32;
  static constexpr int NS = N + 4;      // row stride of q, k, H, dH in shared memory
  static constexpr int PS = P + 8;      // row stride of v, dy
  static constexpr int HS = N / 2 + 1;  // row stride of the per-token phases (at most N / 2 angles)
  static_assert(P % 16 == 0 && N % 32 == 0, "unsupported Mamba-3 head shape");
  __device__ static int tcol(int jj, int ng) { return (jj * 8 + ng) * 4; }
};

struct ChunkScalars {
  float cum[kQ], sig[kQ], gam[kQ], ein[kQ], wend[kQ];
  int cnt[kQ];
  float E, cum_last;
  int cnt_last;
};

// Warp 0 (lane = row of the chunk) fills the chunk's scalars, each row holding its token's; tokens past T read as
// a = γ = σ = 0, no start. Only a token's rank-0 row adds its decay and start into the sums, so every row of the
// token reads the token's cum and cnt.
template <int R>
__device__ void chunk_scalars(ChunkScalars& cs, const Mamba3ScanInputs& in, const Dims& d, int b, int h, int t0,
                              int lane) {
  const int t = t0 + lane / R;
  const bool valid = t < d.T, lead = lane % R == 0;
  const int64_t i = (static_cast<int64_t>(b) * d.T + t) * d.H + h;
  float cum = valid && lead ? in.a[i] : 0.f;
  const float gam = valid ? in.gamma[i] : 0.f, sig = valid ? in.sigma[i] : 0.f;
  int cnt = valid && lead && in.start && in.start[static_cast<int64_t>(b) * d.T + t] ? 1 : 0;
#pragma unroll
  for (int o = 1; o < kQ; o <<= 1) {
    const float u = __shfl_up_sync(kFullMask, cum, o);
    const int c = __shfl_up_sync(kFullMask, cnt, o);
    if (lane >= o) cum += u, cnt += c;
  }
  const float cl = __shfl_sync(kFullMask, cum, kQ - 1);
  const int nl = __shfl_sync(kFullMask, cnt, kQ - 1);
  cs.cum[lane] = cum;
  cs.cnt[lane] = cnt;
  cs.sig[lane] = sig;
  cs.gam[lane] = gam;
  cs.ein[lane] = cnt == 0 ? expf(cum) : 0.f;
  cs.wend[lane] = cnt == nl ? sig * expf(cl - cum) : 0.f;
  if (lane == 0) {
    cs.E = nl == 0 ? expf(cl) : 0.f;
    cs.cum_last = cl;
    cs.cnt_last = nl;
  }
}

// Documents started in the chunk up to each lane's token (an inclusive warp scan; every warp may compute it).
template <int R>
__device__ __forceinline__ int start_count(const Mamba3ScanInputs& in, const Dims& d, int b, int t0, int lane) {
  const int t = t0 + lane / R;
  int cnt = lane % R == 0 && t < d.T && in.start && in.start[static_cast<int64_t>(b) * d.T + t] ? 1 : 0;
#pragma unroll
  for (int o = 1; o < kQ; o <<= 1) {
    const int c = __shfl_up_sync(kFullMask, cnt, o);
    if (lane >= o) cnt += c;
  }
  return cnt;
}

// The phase of every row of the chunk (its token's), ph[j * HS + i], from the phase entering the chunk, carry[i]
// (shared; left holding the phase after the chunk). Warp w of W takes angles w, w + W, ...; lane = row, and only a
// token's rank-0 row adds its step. When saved is not null the entering phases are written there first (the backward
// restarts each chunk from them).
template <int HS, int W, int R>
__device__ void chunk_phase(float* ph, float* carry, float* saved, const Mamba3ScanInputs& in, const Dims& d, int b,
                            int h, int t0, int tid) {
  const int lane = tid % 32, warp = tid / 32, t = t0 + lane / R;
  const bool valid = t < d.T && lane % R == 0;
  const int cnt = start_count<R>(in, d, b, t0, lane);
  const float dt = valid ? in.dt[(static_cast<int64_t>(b) * d.T + t) * d.H + h] : 0.f;
  for (int i = warp; i < d.S; i += W) {
    float v = valid ? dt * in.theta[(static_cast<int64_t>(b) * d.T + t) * d.S + i] : 0.f;
#pragma unroll
    for (int o = 1; o < kQ; o <<= 1) {  // a segmented scan: no step reaches across a document start
      const float u = __shfl_up_sync(kFullMask, v, o);
      const int c = __shfl_up_sync(kFullMask, cnt, o);
      if (lane >= o && c == cnt) v += u;
    }
    const float enter = carry[i];
    if (cnt == 0) v += enter;
    v -= kTwoPi * floorf(v / kTwoPi);
    ph[lane * HS + i] = v;
    const float last = __shfl_sync(kFullMask, v, kQ - 1);
    if (lane == 0) {
      if (saved) saved[i] = enter;
      carry[i] = last;
    }
  }
}

// L[t, s]: the weight of v_s k_sᵀ in the state read by row t, within the chunk; rows of one token (every rank pair)
// meet with the token's γ.
template <int R>
__device__ __forceinline__ float lcoef(const ChunkScalars& cs, int t, int s) {
  if (s / R == t / R) return cs.gam[t];
  if (s > t || cs.cnt[t] != cs.cnt[s]) return 0.f;
  return cs.sig[s] * expf(cs.cum[t] - cs.cum[s]);
}

// The chunk's rotated keys k̃ (from B) and queries q̃ (from C), and its values, into shared memory; zeros past T.
// Row t is token t0 + t / R at rank t % R: SISO rotates interleaved pairs (2i, 2i+1), MIMO half-split ones
// (i, i + N/2), and MIMO's values are the token's x scaled by its rank's mimo_x row.
template <int P, int N, int R, int TH>
__device__ void load_chunk(float* qs, float* ks, float* vs, const float* ph, const Mamba3ScanInputs& in, const Dims& d,
                           int b, int h, int t0, int tid) {
  using L = Layout<P, N>;
  const int g = h / (d.H / d.G);
  for (int idx = tid; idx < kQ * N / 2; idx += TH) {
    const int t = idx / (N / 2), i = idx % (N / 2), tok = t0 + t / R, r = t % R;
    // The pair's two columns.
    const int c0 = R == 1 ? 2 * i : i, c1 = R == 1 ? 2 * i + 1 : i + N / 2;
    float2 kk = {0.f, 0.f}, qq = {0.f, 0.f};
    if (tok < d.T) {
      const int64_t row = ((static_cast<int64_t>(b) * d.T + tok) * R + r) * d.G + g;
      const int64_t bias = (static_cast<int64_t>(h) * R + r) * N;
      if constexpr (R == 1) {
        const float2 bn = *reinterpret_cast<const float2*>(in.bn + row * N + c0);
        const float2 cn = *reinterpret_cast<const float2*>(in.cn + row * N + c0);
        const float2 bb = *reinterpret_cast<const float2*>(in.b_bias + bias + c0);
        const float2 cb = *reinterpret_cast<const float2*>(in.c_bias + bias + c0);
        kk = {bn.x + bb.x, bn.y + bb.y};
        qq = {cn.x + cb.x, cn.y + cb.y};
      } else {
        kk = {in.bn[row * N + c0] + in.b_bias[bias + c0], in.bn[row * N + c1] + in.b_bias[bias + c1]};
        qq = {in.cn[row * N + c0] + in.c_bias[bias + c0], in.cn[row * N + c1] + in.c_bias[bias + c1]};
      }
      if (i < d.S) {
        float sn, cs;
        sincosf(ph[t * L::HS + i], &sn, &cs);
        kk = {kk.x * cs - kk.y * sn, kk.x * sn + kk.y * cs};
        qq = {qq.x * cs - qq.y * sn, qq.x * sn + qq.y * cs};
      }
    }
    if constexpr (R == 1) {
      *reinterpret_cast<float2*>(ks + t * L::NS + c0) = kk;
      *reinterpret_cast<float2*>(qs + t * L::NS + c0) = qq;
    } else {
      ks[t * L::NS + c0] = kk.x, ks[t * L::NS + c1] = kk.y;
      qs[t * L::NS + c0] = qq.x, qs[t * L::NS + c1] = qq.y;
    }
  }
  for (int idx = tid; idx < kQ * P; idx += TH) {
    const int t = idx / P, p = idx % P, tok = t0 + t / R;
    float v = tok < d.T ? in.x[((static_cast<int64_t>(b) * d.T + tok) * d.H + h) * P + p] : 0.f;
    if constexpr (R > 1) v *= in.mimo_x[(static_cast<int64_t>(h) * R + t % R) * P + p];
    vs[t * L::PS + p] = v;
  }
}

// Rows of a [B, T, H, R, P] tensor (y, dy) for the chunk's rows; zeros past T or where src is null.
template <int P, int R, int TH>
__device__ void load_rows(float* dst, const float* src, const Dims& d, int b, int h, int t0, int tid) {
  constexpr int PS = P + 8;
  for (int idx = tid; idx < kQ * P; idx += TH) {
    const int t = idx / P, p = idx % P, tok = t0 + t / R;
    dst[t * PS + p] =
        src && tok < d.T ? src[(((static_cast<int64_t>(b) * d.T + tok) * d.H + h) * R + t % R) * P + p] : 0.f;
  }
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// The chunk's P×N, Q×P and Q×N products run on the tensor cores in 16×16 tiles (WMMA, k 8) with 3xTF32 operands:
// each FP32 operand is split into hi = tf32(v) and lo = tf32(v - hi), and hi·hi + hi·lo + lo·hi keeps the products
// within a few FP32 roundings (the lo·lo term is below FP32's own rounding), so the kernels stay as exact as their
// FP32 reference while the work moves off the shared-memory-bound FMA loops.
namespace wmma = nvcuda::wmma;
using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

template <typename Frag>
__device__ __forceinline__ void split_tf32(Frag& hi, Frag& lo) {
#pragma unroll
  for (int i = 0; i < hi.num_elements; ++i) {
    const float v = hi.x[i], h = wmma::__float_to_tf32(v);
    hi.x[i] = h;
    lo.x[i] = wmma::__float_to_tf32(v - h);
  }
}

// acc += A B for one 16×16 tile over K (a multiple of 8). A (16×K) and B (K×16) are in shared memory, row- or
// column-major (LA, LB) with leading dimensions lda, ldb; a and b point at their (0, 0) elements, 32-byte aligned.
// The small products accumulate apart from hi·hi, so the three products of a step do not wait on one another.
template <typename LA, typename LB, int K>
__device__ __forceinline__ void mma_tile(AccFrag& acc, const float* a, unsigned lda, const float* b, unsigned ldb) {
  constexpr bool a_row = std::is_same_v<LA, wmma::row_major>, b_row = std::is_same_v<LB, wmma::row_major>;
  AccFrag small;
  wmma::fill_fragment(small, 0.f);
#pragma unroll
  for (int kk = 0; kk < K; kk += 8) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> ah, al;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> bh, bl;
    wmma::load_matrix_sync(ah, a + (a_row ? kk : kk * lda), lda);
    wmma::load_matrix_sync(bh, b + (b_row ? kk * ldb : kk), ldb);
    split_tf32(ah, al);
    split_tf32(bh, bl);
    wmma::mma_sync(small, al, bh, small);
    wmma::mma_sync(small, ah, bl, small);
    wmma::mma_sync(acc, ah, bh, acc);
  }
#pragma unroll
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] += small.x[i];
}

// The P×N state (H forward, dH backward) lives in accumulator tiles spread over the W warps: warp w holds tiles
// w, w + W, ... of the (P / 16) × (N / 16) grid, row-major.
template <int P, int N, int W>
struct StateTiles {
  static constexpr int NT = N / 16, count = (P / 16) * NT, per_warp = (count + W - 1) / W;
  __device__ static bool held(int warp, int j) { return warp + W * j < count; }
  __device__ static int row(int warp, int j) { return (warp + W * j) / NT * 16; }
  __device__ static int col(int warp, int j) { return (warp + W * j) % NT * 16; }
};

template <int P, int N, int W>
__device__ __forceinline__ void scale_tiles(AccFrag (&f)[StateTiles<P, N, W>::per_warp], float e) {
#pragma unroll
  for (int j = 0; j < StateTiles<P, N, W>::per_warp; ++j)
#pragma unroll
    for (int i = 0; i < f[j].num_elements; ++i) f[j].x[i] *= e;
}

// R is the rank: the chunk's 32 rows are 32 / R tokens times R ranks (row t: token t / R, rank t % R).
template <int P, int N, int R>
__global__ void __launch_bounds__(kThreads, 2)
    forward_kernel(Dims d, Mamba3ScanInputs in, const float* h0, float* y, float* h_last, float* final_angle,
                   Mamba3Checkpoints cps) {
  using L = Layout<P, N>;
  using ST = StateTiles<P, N, kWarps>;
  extern __shared__ __align__(128) float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float* ks = qs + kQ * L::NS;
  float* vs = ks + kQ * L::NS;
  float* as = vs + kQ * L::PS;  // [kQ][kQS] L ∘ (q kᵀ)
  float* ph = as + kQ * kQS;    // [kQ][HS] the tokens' phases
  float* hs = ph + kQ * L::HS;  // [P][NS] the state entering the chunk
  float* ys = hs + P * L::NS;   // [kQ][PS] q Hᵀ, then the weighted values w_s v_s
  __shared__ ChunkScalars cs;
  __shared__ float carry[N / 2];
  const int bh = blockIdx.x, b = bh / d.H, h = bh % d.H, tid = threadIdx.x, warp = tid / 32;
  const float dh = in.d[h];
  const int64_t head = static_cast<int64_t>(bh) * P * N;
  AccFrag st[ST::per_warp];
#pragma unroll
  for (int j = 0; j < ST::per_warp; ++j) {
    wmma::fill_fragment(st[j], 0.f);
    if (h0 && ST::held(warp, j))
      wmma::load_matrix_sync(st[j], h0 + head + ST::row(warp, j) * N + ST::col(warp, j), N, wmma::mem_row_major);
  }
  if (tid < d.S) carry[tid] = in.angle0[static_cast<int64_t>(bh) * d.S + tid];
  __syncthreads();
  for (int c = 0; c < d.nc; ++c) {
    const int t0 = c * (kQ / R);
#pragma unroll
    for (int j = 0; j < ST::per_warp; ++j)
      if (ST::held(warp, j))
        wmma::store_matrix_sync(hs + ST::row(warp, j) * L::NS + ST::col(warp, j), st[j], L::NS, wmma::mem_row_major);
    chunk_phase<L::HS, kWarps, R>(
        ph, carry, cps.phase ? cps.phase + (static_cast<int64_t>(bh) * d.nc + c) * d.S : nullptr, in, d, b, h, t0, tid);
    if (tid < 32) chunk_scalars<R>(cs, in, d, b, h, t0, tid);
    __syncthreads();
    load_chunk<P, N, R, kThreads>(qs, ks, vs, ph, in, d, b, h, t0, tid);
    if (cps.state) {
      float4* dst = reinterpret_cast<float4*>(cps.state + (static_cast<int64_t>(bh) * d.nc + c) * P * N);
      for (int idx = tid; idx < P * N / 4; idx += kThreads)
        dst[idx] = *reinterpret_cast<const float4*>(hs + idx / (N / 4) * L::NS + 4 * (idx % (N / 4)));
    }
    __syncthreads();
    {
      const int t = tid / 8, sb = tid % 8;
      const float4* qrow = reinterpret_cast<const float4*>(qs + t * L::NS);
#pragma unroll
      for (int i = 0; i < kQ / 8; ++i) {
        const int s = sb + 8 * i;
        float v = 0.f;
        if (s <= (t | (R - 1))) {  // up to the last row of t's token
          const float4* krow = reinterpret_cast<const float4*>(ks + s * L::NS);
          for (int n4 = 0; n4 < N / 4; ++n4) v += dot4(qrow[n4], krow[n4]);
          v *= lcoef<R>(cs, t, s);
        }
        as[t * kQS + s] = v;
      }
    }
    if (constexpr int tiles = (kQ / 16) * (P / 16); warp < tiles) {  // q Hᵀ, [kQ][P]
      const int r = warp / (P / 16) * 16, col = warp % (P / 16) * 16;
      AccFrag acc;
      wmma::fill_fragment(acc, 0.f);
      mma_tile<wmma::row_major, wmma::col_major, N>(acc, qs + r * L::NS, L::NS, hs + col * L::NS, L::NS);
      wmma::store_matrix_sync(ys + r * L::PS + col, acc, L::PS, wmma::mem_row_major);
    }
    __syncthreads();
    for (int idx = tid; idx < kQ * P; idx += kThreads) {
      const int t = idx / P, p = idx % P;
      float acc = cs.ein[t] * ys[t * L::PS + p];
      for (int s = 0; s <= (t | (R - 1)); ++s) acc += as[t * kQS + s] * vs[s * L::PS + p];
      if (const int tok = t0 + t / R; tok < d.T)
        y[(((static_cast<int64_t>(b) * d.T + tok) * d.H + h) * R + t % R) * P + p] = acc + dh * vs[t * L::PS + p];
      ys[t * L::PS + p] = cs.wend[t] * vs[t * L::PS + p];  // only this thread read ys[t][p]
    }
    __syncthreads();
    // H ← E H + Σ_s (w_s v_s) k_sᵀ
    scale_tiles<P, N, kWarps>(st, cs.E);
#pragma unroll
    for (int j = 0; j < ST::per_warp; ++j)
      if (ST::held(warp, j))
        mma_tile<wmma::col_major, wmma::row_major, kQ>(st[j], ys + ST::row(warp, j), L::PS, ks + ST::col(warp, j),
                                                       L::NS);
    __syncthreads();  // the next chunk's loads overwrite what this one read
  }
  if (tid < d.S) final_angle[static_cast<int64_t>(bh) * d.S + tid] = carry[tid];
  if (h_last) {
#pragma unroll
    for (int j = 0; j < ST::per_warp; ++j)
      if (ST::held(warp, j))
        wmma::store_matrix_sync(h_last + head + ST::row(warp, j) * N + ST::col(warp, j), st[j], N, wmma::mem_row_major);
  }
}

// TH threads (256 or 512): the backward's shared memory leaves one CTA per SM. Rows as in the forward (rank R).
template <int P, int N, int R, int TH>
__global__ void __launch_bounds__(TH)
    backward_kernel(Dims d, Mamba3ScanInputs in, Mamba3Checkpoints cps, const float* dy, const float* dh_last,
                    const float* dfinal_angle, Mamba3ScanGrads gr) {
  using L = Layout<P, N>;
  constexpr int kBW = TH / 32;
  using ST = StateTiles<P, N, kBW>;
  constexpr int TT = TH / kQ;  // threads per row in the value layout
  extern __shared__ __align__(128) float4 smem4[];
  float* qs = reinterpret_cast<float*>(smem4);
  float* ks = qs + kQ * L::NS;
  float* hc = ks + kQ * L::NS;  // [P][NS] the state entering the chunk
  float* gs = hc + P * L::NS;   // [P][NS] dH, the gradient of the state leaving the chunk
  float* vs = gs + P * L::NS;
  float* dys = vs + kQ * L::PS;
  // The Q×Q tables [kQ][kQW], read only where row s's token is not after row t's: q_t·k_s, dy_t·v_s, L[t, s] and,
  // where s's token is before t's, e^{cum_t - cum_s} within a document (L[t, s] = σ_s times it).
  float* ssc = dys + kQ * L::PS;
  float* wsc = ssc + kQ * kQW;
  float* lc = wsc + kQ * kQW;
  float* ex = lc + kQ * kQW;
  float* ph = ex + kQ * kQW;      // [kQ][HS] the tokens' phases
  float* dph = ph + kQ * L::HS;   // [kQ][HS] their gradients through the queries
  float* gks = dph + kQ * L::HS;  // [kQ][PS] (dH k_s)[p]
  float* us = gks + kQ * L::PS;   // [kQ][NS] dy_t H_c
  float* zs = us + kQ * L::NS;    // [kQ][NS] v_t dH
  float* dpk = zs + kQ * L::NS;   // [kQ][HS] the phases' gradients through the keys
  float* dvs = dpk + kQ * L::HS;  // MIMO: [kQ][PS] the rows' dv ⊙ mimo_x, summed into dx per token
  __shared__ ChunkScalars cs;
  __shared__ float de[kQ], dw[kQ], dew[kBW], ddw[kBW];
  __shared__ float carry[N / 2], dcarry[N / 2];  // the phase entering the chunk; dφ reaching back past it
  const int bh = blockIdx.x, b = bh / d.H, h = bh % d.H, tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  const float dh = in.d[h];
  const int64_t head = static_cast<int64_t>(bh) * P * N;
  AccFrag g[ST::per_warp];  // dH, the gradient of the state leaving the chunk
#pragma unroll
  for (int j = 0; j < ST::per_warp; ++j) {
    wmma::fill_fragment(g[j], 0.f);
    if (dh_last && ST::held(warp, j))
      wmma::load_matrix_sync(g[j], dh_last + head + ST::row(warp, j) * N + ST::col(warp, j), N, wmma::mem_row_major);
  }
  float dd_acc = 0.f;
  float dmx_acc[P / TT] = {};  // MIMO: this thread's share of dmimo_x, over the chunks (value layout)
  if (tid < d.S) dcarry[tid] = 0.f;
  for (int c = d.nc - 1; c >= 0; --c) {
    const int t0 = c * (kQ / R);
#pragma unroll
    for (int j = 0; j < ST::per_warp; ++j)
      if (ST::held(warp, j))
        wmma::store_matrix_sync(gs + ST::row(warp, j) * L::NS + ST::col(warp, j), g[j], L::NS, wmma::mem_row_major);
    if (tid < d.S) carry[tid] = cps.phase[(static_cast<int64_t>(bh) * d.nc + c) * d.S + tid];
    __syncthreads();
    chunk_phase<L::HS, kBW, R>(ph, carry, nullptr, in, d, b, h, t0, tid);
    if (tid < 32) chunk_scalars<R>(cs, in, d, b, h, t0, tid);
    __syncthreads();
    load_chunk<P, N, R, TH>(qs, ks, vs, ph, in, d, b, h, t0, tid);
    load_rows<P, R, TH>(dys, dy, d, b, h, t0, tid);
    {
      const float4* src = reinterpret_cast<const float4*>(cps.state + (static_cast<int64_t>(bh) * d.nc + c) * P * N);
      for (int idx = tid; idx < P * N / 4; idx += TH) {
        const int pp = idx / (N / 4), n4 = idx % (N / 4);
        *reinterpret_cast<float4*>(hc + pp * L::NS + 4 * n4) = src[idx];
      }
    }
    __syncthreads();

    // The chunk's decay tables, and <dH, H_c> (the gradient of E).
    {
      for (int idx = tid; idx < kQ * kQ; idx += TH) {
        const int t = idx / kQ, s = idx % kQ;
        const float e = s / R < t / R && cs.cnt[t] == cs.cnt[s] ? expf(cs.cum[t] - cs.cum[s]) : 0.f;
        ex[t * kQW + s] = e;
        lc[t * kQW + s] = s / R == t / R ? cs.gam[t] : cs.sig[s] * e;
      }
      float e_part = 0.f;
      for (int idx = tid; idx < P * N / 4; idx += TH) {
        const int at = idx / (N / 4) * L::NS + 4 * (idx % (N / 4));
        e_part += dot4(*reinterpret_cast<const float4*>(gs + at), *reinterpret_cast<const float4*>(hc + at));
      }
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) e_part += __shfl_xor_sync(kFullMask, e_part, o);
      if (lane == 0) dew[warp] = e_part;
    }
    // On the tensor cores: ssc = Q Kᵀ and wsc = dY Vᵀ [kQ][kQ], gks = K dHᵀ [kQ][P], us = dY H_c and zs = V dH [kQ][N].
    {
      constexpr int pt = P / 16, nt = N / 16, qt = kQ / 16, tables = 2 * qt * qt, tiles = tables + 2 * pt + 4 * nt;
      for (int i = warp; i < tiles; i += kBW) {
        AccFrag acc;
        wmma::fill_fragment(acc, 0.f);
        if (i < tables) {
          const bool w = i >= qt * qt;
          const int k = i % (qt * qt), r = k / qt * 16, col = k % qt * 16;
          if (w)
            mma_tile<wmma::row_major, wmma::col_major, P>(acc, dys + r * L::PS, L::PS, vs + col * L::PS, L::PS);
          else
            mma_tile<wmma::row_major, wmma::col_major, N>(acc, qs + r * L::NS, L::NS, ks + col * L::NS, L::NS);
          wmma::store_matrix_sync((w ? wsc : ssc) + r * kQW + col, acc, kQW, wmma::mem_row_major);
        } else if (i < tables + 2 * pt) {
          const int k = i - tables, r = k / pt * 16, col = k % pt * 16;
          mma_tile<wmma::row_major, wmma::col_major, N>(acc, ks + r * L::NS, L::NS, gs + col * L::NS, L::NS);
          wmma::store_matrix_sync(gks + r * L::PS + col, acc, L::PS, wmma::mem_row_major);
        } else {
          const int k = i - tables - 2 * pt, second = k >= 2 * nt, kk = k % (2 * nt), r = kk / nt * 16,
                    col = kk % nt * 16;
          mma_tile<wmma::row_major, wmma::row_major, P>(acc, (second ? vs : dys) + r * L::PS, L::PS,
                                                        (second ? gs : hc) + col, L::NS);
          wmma::store_matrix_sync((second ? zs : us) + r * L::NS + col, acc, L::NS, wmma::mem_row_major);
        }
      }
    }
    __syncthreads();

    // Token layout (8 threads per token): dq̃_t (role 0) and dk̃_t (role 1), then the rotation undone; each role leaves
    // its share of the phases' gradients in dph or dpk. With 512 threads each half takes one role.
    for (int role = TH == 2 * kThreads ? tid / kThreads : 0; role < (TH == 2 * kThreads ? tid / kThreads + 1 : 2);
         ++role) {
      const bool keys = role == 1;
      const int t = tid % kThreads / 8, ng = tid % 8, tok = t0 + t / R;
      const float* own = keys ? ks : qs;    // the row's own rotated key or query
      const float* other = keys ? qs : ks;  // what its gradient sums over
      float a[4 * L::NG] = {}, x[4 * L::NG];
      // queries: Σ_s L[t,s] W[t,s] k_s over rows s up to t's token's last;  keys: Σ_t' L[t',t] W[t',t] q_t' over rows
      // t' from t's token's first
      for (int j = keys ? t & ~(R - 1) : 0, end = keys ? kQ - 1 : t | (R - 1); j <= end; ++j) {
        const int at = keys ? j * kQW + t : t * kQW + j;
        const float coef = lc[at] * wsc[at];
#pragma unroll
        for (int jj = 0; jj < L::NG; ++jj) {
          const float4 ov = *reinterpret_cast<const float4*>(other + j * L::NS + L::tcol(jj, ng));
          a[4 * jj] += coef * ov.x, a[4 * jj + 1] += coef * ov.y, a[4 * jj + 2] += coef * ov.z,
              a[4 * jj + 3] += coef * ov.w;
        }
      }
      // queries: u = dy_t H_c (e_t scales it); keys: z = v_t dH (w_t scales it)
      const float* xs = keys ? zs : us;
#pragma unroll
      for (int jj = 0; jj < L::NG; ++jj) {
        const float4 xv = *reinterpret_cast<const float4*>(xs + t * L::NS + L::tcol(jj, ng));
        x[4 * jj] = xv.x, x[4 * jj + 1] = xv.y, x[4 * jj + 2] = xv.z, x[4 * jj + 3] = xv.w;
      }
      float part = 0.f;  // de_t (queries) or dw_t (keys)
#pragma unroll
      for (int jj = 0; jj < L::NG; ++jj) {
        const float4 ov = *reinterpret_cast<const float4*>(own + t * L::NS + L::tcol(jj, ng));
        part += dot4(ov, make_float4(x[4 * jj], x[4 * jj + 1], x[4 * jj + 2], x[4 * jj + 3]));
      }
#pragma unroll
      for (int o = 4; o >= 1; o >>= 1) part += __shfl_xor_sync(kFullMask, part, o);
      if (ng == 0) (keys ? dw : de)[t] = part;
      const float scale = keys ? cs.wend[t] : cs.ein[t];
      float* dphase = keys ? dpk : dph;
      float* out = keys ? gr.dk_pre : gr.dq_pre;
      const int64_t base = ((static_cast<int64_t>(b) * d.T + tok) * R + t % R) * d.H + h;  // [B, T, R, H]
      // Rotation by φ: r = (u cos - v sin, u sin + v cos); dr/dφ = (-r1, r0); d(u, v) = Rᵀ dr. Rows past T have zero
      // keys and queries: their dφ is 0.
      if constexpr (R == 1) {  // interleaved pairs: within one float4
#pragma unroll
        for (int jj = 0; jj < L::NG; ++jj) {
          const int n0 = L::tcol(jj, ng);
          const float* ov = own + t * L::NS + n0;
          float o4[4];
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const float d0 = a[4 * jj + e] + scale * x[4 * jj + e], d1 = a[4 * jj + e + 1] + scale * x[4 * jj + e + 1];
            const int i = (n0 + e) / 2;
            if (i < d.S) {
              dphase[t * L::HS + i] = -d0 * ov[e + 1] + d1 * ov[e];
              float sn, co;
              sincosf(ph[t * L::HS + i], &sn, &co);
              o4[e] = d0 * co + d1 * sn, o4[e + 1] = -d0 * sn + d1 * co;
            } else {
              o4[e] = d0, o4[e + 1] = d1;
            }
          }
          if (tok < d.T) *reinterpret_cast<float4*>(out + base * N + n0) = make_float4(o4[0], o4[1], o4[2], o4[3]);
        }
      } else {  // half-split pairs (i, i + N/2): column group jj's partners are group jj + NG/2 of the same thread
        static_assert(R == 1 || L::NG % 2 == 0, "MIMO needs d_state >= 64");
#pragma unroll
        for (int jj = 0; jj < L::NG / 2; ++jj) {
          const int n0 = L::tcol(jj, ng), m = jj + L::NG / 2;
          const float* ov = own + t * L::NS + n0;
          float o0[4], o1[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float d0 = a[4 * jj + e] + scale * x[4 * jj + e], d1 = a[4 * m + e] + scale * x[4 * m + e];
            const int i = n0 + e;
            if (i < d.S) {
              dphase[t * L::HS + i] = -d0 * ov[e + N / 2] + d1 * ov[e];
              float sn, co;
              sincosf(ph[t * L::HS + i], &sn, &co);
              o0[e] = d0 * co + d1 * sn, o1[e] = -d0 * sn + d1 * co;
            } else {
              o0[e] = d0, o1[e] = d1;
            }
          }
          if (tok < d.T) {
            *reinterpret_cast<float4*>(out + base * N + n0) = make_float4(o0[0], o0[1], o0[2], o0[3]);
            *reinterpret_cast<float4*>(out + base * N + n0 + N / 2) = make_float4(o1[0], o1[1], o1[2], o1[3]);
          }
        }
      }
    }
    // Value layout: dv_s (= dx_s, SISO; MIMO: dx_t = Σ_r dv_{t,r} ⊙ mimo_x[h,r], dmimo_x[h,r] = Σ_t dv_{t,r} ⊙ x_t).
    {
      constexpr int PT = P / TT;  // each thread's values
      const int s = tid / TT, pg = tid % TT, tok = t0 + s / R;
      const float wend = cs.wend[s];
      float acc[PT] = {};
      for (int tt = s & ~(R - 1); tt < kQ; ++tt) {
        const float coef = lc[tt * kQW + s] * ssc[tt * kQW + s];
#pragma unroll
        for (int i = 0; i < PT; ++i) acc[i] += coef * dys[tt * L::PS + pg + TT * i];
      }
#pragma unroll
      for (int i = 0; i < PT; ++i) {
        const int pp = pg + TT * i;
        const float gk = gks[s * L::PS + pp];
        const float dyv = dys[s * L::PS + pp];
        const int64_t xi = ((static_cast<int64_t>(b) * d.T + tok) * d.H + h) * P + pp;
        if constexpr (R == 1) {
          if (tok < d.T) gr.dx[xi] = acc[i] + wend * gk + dh * dyv;
        } else {
          const float dv = acc[i] + wend * gk + dh * dyv;
          dvs[s * L::PS + pp] = dv * in.mimo_x[(static_cast<int64_t>(h) * R + s % R) * P + pp];
          if (tok < d.T) dmx_acc[i] += dv * in.x[xi];
        }
        dd_acc += dyv * vs[s * L::PS + pp];
      }
    }
    __syncthreads();
    for (int idx = tid; idx < kQ * P; idx += TH) dys[idx / P * L::PS + idx % P] *= cs.ein[idx / P];
    if constexpr (R > 1) {
      for (int idx = tid; idx < kQ / R * P; idx += TH) {
        const int t = idx / P, pp = idx % P, tok = t0 + t;
        float sum = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) sum += dvs[(t * R + r) * L::PS + pp];
        if (tok < d.T) gr.dx[((static_cast<int64_t>(b) * d.T + tok) * d.H + h) * P + pp] = sum;
      }
    }
    __syncthreads();

    // The chunk's scalar gradients (warp 0, lane = row), while every thread carries dH into the previous chunk. Each
    // row's partial sums are over the rows its own row index stands for; the token's gradient sums its rows.
    if (warp == 0) {
      const int j = lane, tok = t0 + j / R;
      // dsig sums dL[t, j] e^{cum_t - cum_j} over the rows of later tokens of j's document; colsum is σ_j times it.
      float rowsum = 0.f, dsig = 0.f;
#pragma unroll
      for (int s = 0; s < kQ; ++s) {
        if (s / R < j / R) rowsum += ssc[j * kQW + s] * wsc[j * kQW + s] * lc[j * kQW + s];
        if (s / R > j / R) dsig += ssc[s * kQW + j] * wsc[s * kQW + j] * ex[s * kQW + j];
      }
      const float colsum = cs.sig[j] * dsig;
      float dgam = 0.f;  // γ weighs every rank pair of the token
#pragma unroll
      for (int s = j & ~(R - 1); s <= (j | (R - 1)); ++s) dgam += ssc[j * kQW + s] * wsc[j * kQW + s];
      const float dwv = dw[j], wend = cs.wend[j];
      if (cs.cnt[j] == cs.cnt_last) dsig += dwv * expf(cs.cum_last - cs.cum[j]);
      float dcum = rowsum - colsum + de[j] * cs.ein[j] - dwv * wend;
      float to_last = dwv * wend;
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) to_last += __shfl_xor_sync(kFullMask, to_last, o);
      if (j == kQ - 1) {
        float dE = 0.f;
#pragma unroll
        for (int w = 0; w < kBW; ++w) dE += dew[w];
        dcum += to_last + dE * cs.E;
      }
#pragma unroll
      for (int o = 1; o < kQ; o <<= 1) {  // da_j = Σ_{u ≥ j} dcum_u (a token's rank-0 row sums all its rows)
        const float v = __shfl_down_sync(kFullMask, dcum, o);
        if (j + o < kQ) dcum += v;
      }
#pragma unroll
      for (int o = 1; o < R; o <<= 1) {  // the token's rows, summed within their aligned group of R lanes
        dgam += __shfl_xor_sync(kFullMask, dgam, o);
        dsig += __shfl_xor_sync(kFullMask, dsig, o);
      }
      if (tok < d.T && j % R == 0) {
        const int64_t i = (static_cast<int64_t>(b) * d.T + tok) * d.H + h;
        gr.da[i] = dcum;
        gr.dgamma[i] = dgam;
        gr.dsigma[i] = dsig;
      }
    }
    // The phase steps' gradients: dstep_u = Σ dφ_t over t ≥ u in u's document (a reverse segmented scan), plus
    // what later chunks sent back when u's document runs to the chunk's end; then into Δ and θ. A token's rank-0 row
    // sums the rows of its token and the later ones, and only it passes the sum on.
    {
      const int tok = t0 + lane / R;
      const bool valid = tok < d.T && lane % R == 0;
      const int cnt = cs.cnt[lane];
      const float dtv = valid ? in.dt[(static_cast<int64_t>(b) * d.T + tok) * d.H + h] : 0.f;
      float ddt = 0.f;
      for (int i = warp; i < d.S; i += kBW) {
        float v = dph[lane * L::HS + i] + dpk[lane * L::HS + i];
        if (dfinal_angle && valid && tok == d.T - 1) v += dfinal_angle[static_cast<int64_t>(bh) * d.S + i];
#pragma unroll
        for (int o = 1; o < kQ; o <<= 1) {
          const float u = __shfl_down_sync(kFullMask, v, o);
          const int cu = __shfl_down_sync(kFullMask, cnt, o);
          if (lane + o < kQ && cu == cnt) v += u;
        }
        if (cnt == cs.cnt_last) v += dcarry[i];
        const float first = __shfl_sync(kFullMask, v, 0);
        if (lane == 0) dcarry[i] = cnt == 0 ? first : 0.f;
        if (valid) {
          const int64_t ti = (static_cast<int64_t>(b) * d.T + tok) * d.S + i;
          ddt += v * in.theta[ti];
          atomicAdd(gr.dtheta + ti, v * dtv);  // the heads of a token meet here
        }
      }
      if (valid && ddt != 0.f) atomicAdd(gr.ddt + (static_cast<int64_t>(b) * d.T + tok) * d.H + h, ddt);
    }
    // dH ← E dH + Σ_t (e_t dy_t) q_tᵀ: the gradient of the state entering the chunk.
    scale_tiles<P, N, kBW>(g, cs.E);
#pragma unroll
    for (int j = 0; j < ST::per_warp; ++j)
      if (ST::held(warp, j))
        mma_tile<wmma::col_major, wmma::row_major, kQ>(g[j], dys + ST::row(warp, j), L::PS, qs + ST::col(warp, j),
                                                       L::NS);
    __syncthreads();
  }
  if (tid < d.S) gr.dangle0[static_cast<int64_t>(bh) * d.S + tid] = dcarry[tid];
  if (gr.dh0) {
#pragma unroll
    for (int j = 0; j < ST::per_warp; ++j)
      if (ST::held(warp, j))
        wmma::store_matrix_sync(gr.dh0 + head + ST::row(warp, j) * N + ST::col(warp, j), g[j], N, wmma::mem_row_major);
  }
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) dd_acc += __shfl_xor_sync(kFullMask, dd_acc, o);
  if (lane == 0) ddw[warp] = dd_acc;
  __syncthreads();
  if (tid == 0) {
    float sum = 0.f;
    for (int w = 0; w < kBW; ++w) sum += ddw[w];
    atomicAdd(gr.dd + h, sum);  // the batch rows of a head meet here
  }
  if constexpr (R > 1) {  // dmimo_x: the rows of one rank, summed over the chunk's tokens, then over the batch rows
    constexpr int PT = P / TT;
#pragma unroll
    for (int i = 0; i < PT; ++i) dvs[tid / TT * L::PS + tid % TT + TT * i] = dmx_acc[i];
    __syncthreads();
    for (int idx = tid; idx < R * P; idx += TH) {
      const int r = idx / P, pp = idx % P;
      float sum = 0.f;
      for (int t = 0; t < kQ / R; ++t) sum += dvs[(t * R + r) * L::PS + pp];
      atomicAdd(gr.dmimo_x + (static_cast<int64_t>(h) * R + r) * P + pp, sum);
    }
  }
}

template <int P, int N>
int64_t forward_smem() {
  using L = Layout<P, N>;
  return 4 * (2 * kQ * L::NS + 2 * kQ * L::PS + kQ * kQS + kQ * L::HS + P * L::NS);
}

// P 64, N 128: 201 KB for SISO, 210 KB for MIMO (dvs), within the 227 KB an sm_90 CTA may take.
template <int P, int N, int R>
int64_t backward_smem() {
  using L = Layout<P, N>;
  return 4 * (4 * kQ * L::NS + 2 * P * L::NS + (R == 1 ? 3 : 4) * kQ * L::PS + 4 * kQ * kQW + 3 * kQ * L::HS);
}

std::string launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(e);
}

template <typename Kernel>
std::string prepare(Kernel kernel, int64_t smem) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess)
    return launch_error("mamba3: cudaFuncSetAttribute");
  return {};
}

Dims dims(const Mamba3Shape& s) {
  const int64_t tokens_per_chunk = kQ / s.rank;
  return {static_cast<int>(s.tokens), static_cast<int>(s.heads), static_cast<int>(s.groups), static_cast<int>(s.angles),
          static_cast<int>((s.tokens + tokens_per_chunk - 1) / tokens_per_chunk)};
}

template <int P, int N, int R>
std::string forward_pn(const Mamba3Shape& s, const Mamba3ScanInputs& in, const float* h0, float* y, float* h_last,
                       float* final_angle, const Mamba3Checkpoints& cps, cudaStream_t stream) {
  const int64_t smem = forward_smem<P, N>();
  if (auto e = prepare(forward_kernel<P, N, R>, smem); !e.empty()) return e;
  forward_kernel<P, N, R><<<static_cast<unsigned>(s.batch * s.heads), kThreads, smem, stream>>>(
      dims(s), in, h0, y, h_last, final_angle, cps);
  return launch_error("mamba3 forward");
}

template <int P, int N, int R, int TH>
std::string backward_pn_th(const Mamba3Shape& s, const Mamba3ScanInputs& in, const Mamba3Checkpoints& cps,
                           const float* dy, const float* dh_last, const float* dfinal_angle, const Mamba3ScanGrads& g,
                           cudaStream_t stream) {
  const int64_t smem = backward_smem<P, N, R>();
  if (auto e = prepare(backward_kernel<P, N, R, TH>, smem); !e.empty()) return e;
  backward_kernel<P, N, R, TH>
      <<<static_cast<unsigned>(s.batch * s.heads), TH, smem, stream>>>(dims(s), in, cps, dy, dh_last, dfinal_angle, g);
  return launch_error("mamba3 backward");
}

template <int P, int N, int R>
std::string backward_pn(const Mamba3Shape& s, const Mamba3ScanInputs& in, const Mamba3Checkpoints& cps, const float* dy,
                        const float* dh_last, const float* dfinal_angle, const Mamba3ScanGrads& g,
                        cudaStream_t stream) {
  // 16 warps where the state is large (N 64: 7.7 against 8.3 ms at batch 64 x 1024 with 8; N 128: 21.5 against
  // 28.0); at N 32 the 8-warp CTA's shorter phases win (8.6 against 11.5). bench/mamba3_bench, H200, SISO.
  if constexpr (N >= 64)
    return backward_pn_th<P, N, R, 512>(s, in, cps, dy, dh_last, dfinal_angle, g, stream);
  else
    return backward_pn_th<P, N, R, 256>(s, in, cps, dy, dh_last, dfinal_angle, g, stream);
}

std::string check(const Mamba3Shape& s) {
  if (!mamba3_supported(s.headdim, s.d_state, s.angles, s.rank))
    return "mamba3: no fused kernel for headdim " + std::to_string(s.headdim) + ", d_state " +
           std::to_string(s.d_state) + ", " + std::to_string(s.angles) + " rotary angles, rank " +
           std::to_string(s.rank);
  if (s.groups < 1 || s.heads % s.groups) return "mamba3: heads do not split into groups";
  return {};
}

}  // namespace

bool mamba3_supported(int64_t headdim, int64_t d_state, int64_t angles, int64_t rank) {
  if ((headdim != 32 && headdim != 64) || angles < 1 || 2 * angles > d_state) return false;
  if (rank == 1) return d_state == 32 || d_state == 64 || d_state == 128;
  // MIMO's half-split rotation pairs columns N/2 apart, which one thread of the backward holds together from N 64 on.
  return (rank == 2 || rank == 4) && (d_state == 64 || d_state == 128);
}

int64_t mamba3_chunk(int64_t rank) {
  return kQ / rank;
}

// The compiled head shapes (mamba3_supported): SISO headdim 32 or 64 times d_state 32, 64 or 128; MIMO rank 2 or 4
// times headdim 32 or 64 times d_state 64 or 128.
#define SLM_MAMBA3_DISPATCH(CALL)                                                                         \
  if (auto e = check(s); !e.empty()) return e;                                                            \
  const bool p64 = s.headdim == 64, n64 = s.d_state == 64;                                                \
  if (s.rank == 2)                                                                                        \
    return n64 ? (p64 ? CALL(64, 64, 2) : CALL(32, 64, 2)) : (p64 ? CALL(64, 128, 2) : CALL(32, 128, 2)); \
  if (s.rank == 4)                                                                                        \
    return n64 ? (p64 ? CALL(64, 64, 4) : CALL(32, 64, 4)) : (p64 ? CALL(64, 128, 4) : CALL(32, 128, 4)); \
  switch (s.d_state) {                                                                                    \
    case 32: return p64 ? CALL(64, 32, 1) : CALL(32, 32, 1);                                              \
    case 64: return p64 ? CALL(64, 64, 1) : CALL(32, 64, 1);                                              \
    default: return p64 ? CALL(64, 128, 1) : CALL(32, 128, 1);                                            \
  }

std::string mamba3_forward(const Mamba3Shape& s, const Mamba3ScanInputs& in, const float* h0, float* y, float* h_last,
                           float* final_angle, const Mamba3Checkpoints& cps, void* stream){
#define SLM_CALL(P, N, R) forward_pn<P, N, R>(s, in, h0, y, h_last, final_angle, cps, static_cast<cudaStream_t>(stream))
    SLM_MAMBA3_DISPATCH(SLM_CALL)
#undef SLM_CALL
}

std::string
    mamba3_backward(const Mamba3Shape& s, const Mamba3ScanInputs& in, const Mamba3Checkpoints& cps, const float* dy,
                    const float* dh_last, const float* dfinal_angle, const Mamba3ScanGrads& g, void* stream) {
#define SLM_CALL(P, N, R) \
  backward_pn<P, N, R>(s, in, cps, dy, dh_last, dfinal_angle, g, static_cast<cudaStream_t>(stream))
  SLM_MAMBA3_DISPATCH(SLM_CALL)
#undef SLM_CALL
}

#undef SLM_MAMBA3_DISPATCH

}  // namespace slm::ops::cuda
