// Weight-only NVFP4 GEMV for decode batches (M = 1..16 per launch) on sm_90: NVFP4 weights, BF16 activations,
// FP32 accumulation. Hopper has no FP4 tensor cores and at these batch sizes the product is bound by weight bytes,
// so the kernel streams the 4.5-bit weights once and keeps the decode cheap enough to hide under the loads: the
// CUDA cores only turn codes into BF16 (about one integer op per weight), the BF16 tensor cores (mma.sync
// m16n8k16, FP32 accumulators) do the multiply-adds for all M rows at once, so one decode serves the whole batch.
//
// Work split: a CTA owns 16 output rows (the mma's M dimension); its S warps split K. Lane (g, t) of a warp holds
// rows g and g + 8 and, per step, one chunk of CB blocks (16 B of codes for CB = 2) of each, so a warp's load covers
// 64 contiguous bytes of 8 rows. Each thread issues the loads of U steps before any math; the warps' partial sums
// meet in shared memory. With programmatic dependent launch the weight loads of one GEMV overlap the tail of the
// previous one. Measured on an H200 the kernel is latency-bound (warps mostly wait on their loads), not
// decode-bound: bench/RESULTS.md.
//
// Exactness (nvfp4_decode.cuh): the decoded weights times their block scale are exact BF16 values of value * scale *
// 2^-8 (the scales from a 256-entry table here). The tensor cores multiply BF16 pairs exactly and accumulate in FP32,
// like the reference up to the order of the additions.
//
// Order of k inside an mma: the k slots of a fragment may map to any physical k as long as A (weights) and B
// (activations) agree. The decode pairs nibbles j and j + 4 of a 32-bit code word (cheapest to extract), so B pairs
// activations k0 + j and k0 + j + 4 with one byte permute each.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "slm/ops/cuda/nvfp4_decode.cuh"
#include "slm/quant/cuda/nvfp4_gemv.h"

namespace slm::nvfp4::cuda {

using ops::cuda::bf16x2_mul;
using ops::cuda::decode_word;
using ops::cuda::scale_bf16x2;

namespace {

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights are read once: keep them out of L1 so the activations stay there.
template <int CB>
__device__ __forceinline__ void load_codes(const uint8_t* p, uint32_t (&v)[2 * CB]) {
  if constexpr (CB == 2) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
        : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
  }
}

template <int CB>
__device__ __forceinline__ uint32_t load_scales(const uint8_t* p) {
  if constexpr (CB == 2)
    return __ldg(reinterpret_cast<const uint16_t*>(p));
  else
    return __ldg(p);
}

// The warps' accumulators (two chains each) -> partial[warp][row][batch].
template <int MT, int W>
__device__ __forceinline__ void store_partials(float (&partial)[W][16][8 * MT], const float (&acc)[2][MT][4], int warp,
                                               int g, int t) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    partial[warp][g][8 * mt + 2 * t] = acc[0][mt][0] + acc[1][mt][0];
    partial[warp][g][8 * mt + 2 * t + 1] = acc[0][mt][1] + acc[1][mt][1];
    partial[warp][g + 8][8 * mt + 2 * t] = acc[0][mt][2] + acc[1][mt][2];
    partial[warp][g + 8][8 * mt + 2 * t + 1] = acc[0][mt][3] + acc[1][mt][3];
  }
}

// One thread's share of U steps: codes and scale bytes of rows g and g + 8.
template <int CB, int U>
struct Batch {
  uint32_t codes[U][2][2 * CB];
  uint32_t scales[U][2];
};

// MT: n8 tiles of the batch (1 for M <= 8, 2 for M <= 16). CB: blocks per chunk (2: 16-byte loads, 1: 8-byte).
// S: warps per CTA. XS: the activations are staged in shared memory, already in the mma's k order (when they fit).
// U: steps per batch. PDL: programmatic dependent launch (the weights are read while the previous kernel runs).
// Routed experts, over a stack of gather.experts matrices [N, K]. Assignment a reads row a / gather.x_div of x and
// writes row a of y.
//   gathered (ids set): CTA row blockIdx.y is assignment a, multiplied by matrix ids[a] (M = 1).
//   grouped (order and ends set): CTA (blockIdx.y = e, blockIdx.z = c) takes the assignments order[r0 .. r0 + 16) of
//   expert e's run in the sorted order, r0 = its start + 16 c (ends: each run's end), up to 16 rows that share one
//   read of matrix e. CTAs past their run's end exit at once.
struct Gather {
  const int64_t* ids = nullptr;    // [assignments] on the device; nullptr: not gathered
  const int64_t* order = nullptr;  // [assignments] sorted by expert; nullptr: not grouped
  const int32_t* ends = nullptr;   // [experts] cumulative run ends in order
  int64_t x_div = 1;
  int64_t experts = 1;
};

// O: the output's element type, float or __nv_bfloat16 (rounded to nearest even, as a cast of the FP32 result is).
template <int CB, int MT, int S, bool XS, int U, bool PDL, class O>
__global__ void __launch_bounds__(S * 32)
    nvfp4_gemv_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                      const float* __restrict__ tensor_scale, const __nv_bfloat16* __restrict__ x, O* __restrict__ y,
                      int M, int64_t N, int64_t blocks, Gather gather) {
  __shared__ uint32_t scale_lut[256];       // E4M3 byte -> BF16x2 (scale * 2^118, twice)
  __shared__ float partial[S][16][8 * MT];  // [warp][row][batch]
  extern __shared__ uint4 xs[];             // XS: [m][k / 8] BF16 pairs (k, k + 4) .. (k + 3, k + 7)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t row_bytes = blocks * 8, ldx = blocks * 16;
  int64_t r0 = 0;  // grouped: the CTA's first row in the sorted order
  if (gather.ids != nullptr) {
    // The ids come from the router's top-k; the clamp keeps a bad one inside the stack instead of reading past it.
    const int64_t a = blockIdx.y;
    const int64_t e = min(max(gather.ids[a], int64_t{0}), gather.experts - 1);
    codes += e * N * row_bytes;
    scales += e * N * blocks;
    tensor_scale += e;
    x += (a / gather.x_div) * ldx;
    y += a * N;
  } else if (gather.order != nullptr) {
    const int64_t e = blockIdx.y;
    const int64_t end = gather.ends[e];
    r0 = (e == 0 ? 0 : gather.ends[e - 1]) + static_cast<int64_t>(blockIdx.z) * 16;
    if (r0 >= end) return;  // the whole CTA, before any barrier
    M = static_cast<int>(min(end - r0, int64_t{16}));
    codes += e * N * row_bytes;
    scales += e * N * blocks;
    tensor_scale += e;
  }
  // Row m of x and of y for this CTA.
  auto x_row = [&](int m) {
    return gather.order != nullptr ? x + (gather.order[r0 + m] / gather.x_div) * ldx : x + m * ldx;
  };
  auto y_row = [&](int m) { return gather.order != nullptr ? y + gather.order[r0 + m] * N : y + m * N; };
  const int groups = static_cast<int>(blocks * 2), ldxs = groups + 1;
  const int64_t chunks = blocks / CB, slabs = (chunks + 3) / 4;  // slab: the 4 chunks of one warp step
  const uint8_t* crow[2];
  const uint8_t* srow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // Rows past N read row N - 1 (valid memory) and are never stored.
    const int64_t row = min(n0 + g + 8 * r, N - 1);
    crow[r] = codes + row * row_bytes + t * CB * 8;
    srow[r] = scales + row * blocks + t * CB;
  }
  // Batch from slab s0: slabs s0 + u S, i.e. chunks (s0 + u S) * 4 + t.
  Batch<CB, U> bt;
  auto load = [&](int64_t s0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c0 = (s0 + u * S) * 4;
      const bool valid = c0 + t < chunks;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (valid) {
          load_codes<CB>(crow[r] + c0 * CB * 8, bt.codes[u][r]);
          bt.scales[u][r] = load_scales<CB>(srow[r] + c0 * CB);
        } else {
#pragma unroll
          for (int i = 0; i < 2 * CB; ++i) bt.codes[u][r][i] = 0;
          bt.scales[u][r] = 0;
        }
      }
    }
  };

  // The first batch's weight loads go out before the setup, so HBM starts working at once.
  if (warp < slabs) load(warp);
  if constexpr (PDL) {
    // Only the weights are read before the previous grid has completed: activations, the tensor scale and the
    // output belong to the dependency chain.
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  for (int i = threadIdx.x; i < 256; i += S * 32) scale_lut[i] = scale_bf16x2(i);
  if constexpr (XS) {
    for (int m = 0; m < M; ++m) {
      const uint4* xr = reinterpret_cast<const uint4*>(x_row(m));
      for (int q = threadIdx.x; q < groups; q += S * 32) {
        const uint4 v = __ldg(xr + q);
        xs[m * ldxs + q] = make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                                      __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
      }
    }
  }
  const float s_dec = __ldg(tensor_scale);
  const __nv_bfloat16* xrow[MT];  // this thread's rows g + 8 mt of x (the non-staged path)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xrow[mt] = g + 8 * mt < M ? x_row(g + 8 * mt) : x;
  __syncthreads();

  // Two accumulator chains (even and odd code words) halve the dependent-mma latency.
  float acc[2][MT][4] = {};
  for (int64_t s0 = warp; s0 < slabs; s0 += U * S) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t slab = s0 + u * S;
      if (slab >= slabs) break;  // warp-uniform
      const int64_t c = slab * 4 + t;
      const bool valid = c < chunks;
#pragma unroll
      for (int b = 0; b < CB; ++b) {
        const uint32_t sc0 = scale_lut[(bt.scales[u][0] >> (8 * b)) & 0xFF];
        const uint32_t sc1 = scale_lut[(bt.scales[u][1] >> (8 * b)) & 0xFF];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t a0[4], a1[4];
          decode_word(bt.codes[u][0][2 * b + h], a0);
          decode_word(bt.codes[u][1][2 * b + h], a1);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            a0[j] = bf16x2_mul(a0[j], sc0);
            a1[j] = bf16x2_mul(a1[j], sc1);
          }
          const int q = static_cast<int>((c * CB + b) * 2 + h);  // 8-element group of k
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int m = g + 8 * mt;
            uint4 bv = make_uint4(0, 0, 0, 0);
            if (valid && m < M) {
              if constexpr (XS) {
                bv = xs[m * ldxs + q];
              } else {
                // B pairs (k0 + j, k0 + j + 4), matching the decode.
                const uint4 v = __ldg(reinterpret_cast<const uint4*>(xrow[mt]) + q);
                bv = make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                                __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
              }
            }
            mma_bf16(acc[h][mt], a0[0], a1[0], a0[1], a1[1], bv.x, bv.y);
            mma_bf16(acc[h][mt], a0[2], a1[2], a0[3], a1[3], bv.z, bv.w);
          }
        }
      }
    }
    if (s0 + U * S < slabs) load(s0 + U * S);
  }

  // The warps' partial sums meet in shared memory.
  store_partials<MT, S>(partial, acc, warp, g, t);
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * M; i += S * 32) {
    const int r = i & 15, m = i >> 4;
    if (n0 + r >= N) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < S; ++w) sum += partial[w][r][m];
    const float v = sum * 256.0f * s_dec;  // undo the 2^-8 folded into the BF16 weights
    if constexpr (std::is_same_v<O, float>)
      y_row(m)[n0 + r] = v;
    else
      y_row(m)[n0 + r] = __float2bfloat16_rn(v);
  }
}

template <int CB, int MT, int S, bool XS, int U, bool PDL, class O>
cudaError_t launch_kernel(int M, const uint8_t* codes, const uint8_t* scales, const float* ts, const __nv_bfloat16* x,
                          O* y, int64_t N, int64_t blocks, size_t smem, cudaStream_t stream, Gather gather,
                          unsigned grid_y, unsigned grid_z) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((N + 15) / 16), grid_y, grid_z);
  cfg.blockDim = dim3(S * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, nvfp4_gemv_kernel<CB, MT, S, XS, U, PDL, O>, codes, scales, ts, x, y, M, N, blocks,
                            gather);
}

// Configurations measured on an H200 (bench/nvfp4_gemv_variants.cu, bench/RESULTS.md). XS: staging pays for one or
// two activation rows; larger batches read them through L1. The staged rows share the default 48 KiB per block with
// the static arrays (no opt-in needed).
template <int CB, int MT, int S, int U, bool PDL, class O>
cudaError_t launch3(int M, const uint8_t* codes, const uint8_t* scales, const float* ts, const __nv_bfloat16* x, O* y,
                    int64_t N, int64_t blocks, cudaStream_t stream, Gather gather, unsigned grid_y, unsigned grid_z) {
  const size_t static_bytes = 256 * 4 + S * 16 * 8 * MT * 4;
  const size_t staged = static_cast<size_t>(M) * (blocks * 2 + 1) * 16;
  if (M <= 2 && staged + static_bytes <= 48 * 1024)
    return launch_kernel<CB, MT, S, true, U, PDL, O>(M, codes, scales, ts, x, y, N, blocks, staged, stream, gather,
                                                     grid_y, grid_z);
  return launch_kernel<CB, MT, S, false, U, PDL, O>(M, codes, scales, ts, x, y, N, blocks, 0, stream, gather, grid_y,
                                                    grid_z);
}

template <int CB, bool PDL, class O>
cudaError_t launch(int M, const uint8_t* codes, const uint8_t* scales, const float* ts, const __nv_bfloat16* x, O* y,
                   int64_t N, int64_t blocks, cudaStream_t stream, Gather gather = {}, unsigned grid_y = 1,
                   unsigned grid_z = 1) {
  // Up to two row tiles per SM (132 SMs on an H200): a 16-warp K split keeps about 32 warps per SM busy. More
  // tiles: 8 warps per CTA, with 4 steps per batch for one or two rows. A gathered launch has a row of tiles per
  // assignment, a grouped one per expert (its CTAs past a run's end exit at once and are not counted).
  const bool few_tiles = (N + 15) / 16 * grid_y <= 264;
  if (M <= 8) {
    if (few_tiles)
      return launch3<CB, 1, 16, 2, PDL, O>(M, codes, scales, ts, x, y, N, blocks, stream, gather, grid_y, grid_z);
    return M <= 2 ? launch3<CB, 1, 8, 4, PDL, O>(M, codes, scales, ts, x, y, N, blocks, stream, gather, grid_y, grid_z)
                  : launch3<CB, 1, 8, 2, PDL, O>(M, codes, scales, ts, x, y, N, blocks, stream, gather, grid_y, grid_z);
  }
  return few_tiles
             ? launch3<CB, 2, 16, 2, PDL, O>(M, codes, scales, ts, x, y, N, blocks, stream, gather, grid_y, grid_z)
             : launch3<CB, 2, 8, 2, PDL, O>(M, codes, scales, ts, x, y, N, blocks, stream, gather, grid_y, grid_z);
}

// 16-byte code loads need an even number of blocks per row and aligned codes and scales.
bool vec16_loads(const uint8_t* codes, const uint8_t* scales, int64_t blocks) {
  return blocks % 2 == 0 && reinterpret_cast<uintptr_t>(codes) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(scales) % 2 == 0;
}

}  // namespace

namespace {
template <class O>
std::string gemv_rows(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x_in, O* y,
                      int64_t M, int64_t N, int64_t blocks, void* stream_in, bool pdl) {
  if (M <= 0 || N <= 0) return "";
  if (reinterpret_cast<uintptr_t>(codes) % 8 != 0) return "codes pointer is not 8-byte aligned";
  if (reinterpret_cast<uintptr_t>(x_in) % 16 != 0) return "activation pointer is not 16-byte aligned";
  if ((N + 15) / 16 > 0x7FFFFFFF) return "N too large";
  const bool vec16 = vec16_loads(codes, scales, blocks);
  auto stream = static_cast<cudaStream_t>(stream_in);
  const auto* x = static_cast<const __nv_bfloat16*>(x_in);
  const int64_t ldx = blocks * 16;
  for (int64_t m0 = 0; m0 < M; m0 += 16) {
    const int mc = static_cast<int>(M - m0 < 16 ? M - m0 : 16);
    const __nv_bfloat16* xm = x + m0 * ldx;
    O* ym = y + m0 * N;
    const cudaError_t err =
        vec16 ? (pdl ? launch<2, true, O>(mc, codes, scales, tensor_scale, xm, ym, N, blocks, stream)
                     : launch<2, false, O>(mc, codes, scales, tensor_scale, xm, ym, N, blocks, stream))
              : (pdl ? launch<1, true, O>(mc, codes, scales, tensor_scale, xm, ym, N, blocks, stream)
                     : launch<1, false, O>(mc, codes, scales, tensor_scale, xm, ym, N, blocks, stream));
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return "";
}
}  // namespace

std::string gemv(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x, void* y,
                 int64_t M, int64_t N, int64_t blocks, void* stream, bool pdl, bool bf16_out) {
  return bf16_out ? gemv_rows(codes, scales, tensor_scale, x, static_cast<__nv_bfloat16*>(y), M, N, blocks, stream, pdl)
                  : gemv_rows(codes, scales, tensor_scale, x, static_cast<float*>(y), M, N, blocks, stream, pdl);
}

namespace {
// The checks and launch of gemv_gathered and gemv_grouped: M is 1 (gathered) or up to 16 (grouped, set per CTA).
std::string launch_routed(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x_in,
                          void* y, bool bf16_out, Gather gather, int M, unsigned grid_y, unsigned grid_z, int64_t N,
                          int64_t blocks, void* stream_in) {
  if (reinterpret_cast<uintptr_t>(codes) % 8 != 0) return "codes pointer is not 8-byte aligned";
  if (reinterpret_cast<uintptr_t>(x_in) % 16 != 0) return "activation pointer is not 16-byte aligned";
  if (gather.x_div < 1 || gather.experts < 1) return "x_div and experts must be positive";
  if ((N + 15) / 16 > 0x7FFFFFFF) return "N too large";
  // Every matrix of the stack starts at a multiple of N rows: aligned like the first when N * row_bytes keeps it so.
  const bool vec16 = vec16_loads(codes, scales, blocks) && (N * blocks * 8) % 16 == 0 && (N * blocks) % 2 == 0;
  auto stream = static_cast<cudaStream_t>(stream_in);
  const auto* x = static_cast<const __nv_bfloat16*>(x_in);
  // No programmatic dependent launch: the ids, read first, come from the kernel just before.
  const auto run = [&](auto* out) {
    using O = std::remove_pointer_t<decltype(out)>;
    return vec16
               ? launch<2, false, O>(M, codes, scales, tensor_scale, x, out, N, blocks, stream, gather, grid_y, grid_z)
               : launch<1, false, O>(M, codes, scales, tensor_scale, x, out, N, blocks, stream, gather, grid_y, grid_z);
  };
  const cudaError_t err = bf16_out ? run(static_cast<__nv_bfloat16*>(y)) : run(static_cast<float*>(y));
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}
}  // namespace

std::string gemv_gathered(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x,
                          void* y, const int64_t* ids, int64_t assignments, int64_t x_div, int64_t experts, int64_t N,
                          int64_t blocks, void* stream, bool bf16_out) {
  if (assignments <= 0 || N <= 0) return "";
  if (assignments > 65535) return "more than 65535 assignments in one launch";
  Gather gather;
  gather.ids = ids;
  gather.x_div = x_div;
  gather.experts = experts;
  return launch_routed(codes, scales, tensor_scale, x, y, bf16_out, gather, 1, static_cast<unsigned>(assignments), 1, N,
                       blocks, stream);
}

std::string gemv_grouped(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x, void* y,
                         const int64_t* order, const int32_t* ends, int64_t assignments, int64_t x_div, int64_t experts,
                         int64_t N, int64_t blocks, void* stream, bool bf16_out) {
  if (assignments <= 0 || N <= 0) return "";
  if (experts > 65535 || (assignments + 15) / 16 > 65535) return "too many experts or assignments for one launch";
  Gather gather;
  gather.order = order;
  gather.ends = ends;
  gather.x_div = x_div;
  gather.experts = experts;
  // Any expert may hold every assignment: as many 16-row chunks per expert as the assignments fill.
  return launch_routed(codes, scales, tensor_scale, x, y, bf16_out, gather, 16, static_cast<unsigned>(experts),
                       static_cast<unsigned>((assignments + 15) / 16), N, blocks, stream);
}

}  // namespace slm::nvfp4::cuda
