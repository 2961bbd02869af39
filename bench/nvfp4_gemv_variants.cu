// Configuration sweep of the NVFP4 GEMV (not a test; see bench/RESULTS.md): the shipped launcher (gemv()), the
// register kernel's configurations (it includes the kernel's translation unit to reach its template parameters:
// warps per CTA S, steps per batch U, staged activations XS, programmatic dependent launch PDL), and two
// shared-memory pipeline kernels defined below that were measured against it and are not shipped. Each configuration
// is timed like nvfp4_gemv_bench: 64 launches per CUDA graph, weight copies rotating through 256 MiB. It also times
// the streaming-read reference at several sizes, because a read of a few MiB cannot reach the bandwidth of a 1 GiB one.
//
//   nvcc -std=c++17 -arch=sm_90 -O3 -I src -I bench bench/nvfp4_gemv_variants.cu -o /tmp/nvfp4_gemv_variants
//   /tmp/nvfp4_gemv_variants            # on the GPU machine; about four minutes
//
// Random codes and scales; every 7th row (61st for the 25 MB shapes) of every configuration's first launch is checked
// against a float64 CPU loop: "err" is max |y - ref| / sum |terms|, and "WRONG" marks one above 1e-5.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../bench/gpu_graph_timer.h"
#include "../bench/gpu_read_bandwidth.cu"
#include "../src/slm/quant/cuda/nvfp4_gemv.cu"

namespace slm::nvfp4::cuda {
namespace {

namespace cg = cooperative_groups;

// ---- Two shared-memory pipelines, measured against the shipped register kernel and not shipped (slower at every
// decode shape on the H200; bench/RESULTS.md has the numbers) ----
//
// The hypothesis they test: the register kernel issues all of a CTA's loads, waits, then computes, so an SM's memory
// pipe idles while it decodes, and it reads each row in 64-byte pieces. Here the weights of a CTA's 16 rows stream
// through a ring of shared-memory stages while the warps decode earlier stages. Two ways to fill the ring: bulk
// asynchronous copies issued by one producer warp (cp.async.bulk, completing on mbarriers; per row and stage, or the
// whole contiguous tile in two copies) and 16-byte cp.async copies issued by every thread (commit groups). A stage is
// 64 blocks (1024 k) of 16 rows; its code rows are padded to 576 bytes so that the 16-byte reads of the mma lanes hit
// distinct banks, its scale rows to 80 bytes for the same reason. Split-K: KS CTAs of one cluster share a tile and
// sum their partial outputs through distributed shared memory in a fixed order.
namespace pipe {
constexpr int kStageBlocks = 64;
constexpr int kCodeRow = kStageBlocks * 8 + 64;
constexpr int kScaleRow = kStageBlocks + 16;
constexpr int kStageBytes = 16 * kCodeRow + 16 * kScaleRow;
constexpr int kMaxSlots = 8;
constexpr int kMaxSplit = 4;
constexpr int kMaxDynamicSmem = 160 * 1024;
}  // namespace pipe

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred P;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n @!P bra WAIT;\n}\n" ::"r"(
          smem_u32(b)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

__device__ __forceinline__ void copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}

// One warp's multiply-adds of a 16-row x 128-k chunk in shared memory. Lane (g, t) takes 16 bytes of codes (blocks
// 2t and 2t + 1 of the chunk) of rows g and g + 8 at `codes` (row stride code_row) and their two scale bytes at
// `scales`; q is the 8-element group of k of the lane's first word, xs (XS) holds the groups from q0 on.
template <int MT, bool XS>
__device__ __forceinline__ void chunk_mma(const uint8_t* codes, int code_row, const uint8_t* scales, int scale_row,
                                          const uint32_t* scale_lut, const uint4* xs, int ldxs, int64_t q0,
                                          const __nv_bfloat16* x, int64_t ldx, int64_t q, int M, int g,
                                          float (&acc)[2][MT][4]) {
  const uint4 w0 = *reinterpret_cast<const uint4*>(codes + g * code_row);
  const uint4 w1 = *reinterpret_cast<const uint4*>(codes + (g + 8) * code_row);
  const uint32_t s0 = *reinterpret_cast<const uint16_t*>(scales + g * scale_row);
  const uint32_t s1 = *reinterpret_cast<const uint16_t*>(scales + (g + 8) * scale_row);
  const uint32_t c0[4] = {w0.x, w0.y, w0.z, w0.w}, c1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t sc0 = scale_lut[(s0 >> (8 * (j >> 1))) & 0xFF];
    const uint32_t sc1 = scale_lut[(s1 >> (8 * (j >> 1))) & 0xFF];
    uint32_t a0[4], a1[4];
    decode_word(c0[j], a0);
    decode_word(c1[j], a1);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      a0[e] = bf16x2_mul(a0[e], sc0);
      a1[e] = bf16x2_mul(a1[e], sc1);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = g + 8 * mt;
      uint4 bv = make_uint4(0, 0, 0, 0);
      if (m < M) {
        if constexpr (XS) {
          bv = xs[m * ldxs + (q + j - q0)];
        } else {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + m * ldx) + q + j);
          bv = make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                          __byte_perm(v.y, v.w, 0x7632));
        }
      }
      mma_bf16(acc[j & 1][mt], a0[0], a1[0], a0[1], a1[1], bv.x, bv.y);
      mma_bf16(acc[j & 1][mt], a0[2], a1[2], a0[3], a1[3], bv.z, bv.w);
    }
  }
}

// Shared setup of the pipelined kernels: the scale table and (XS) the activations of k groups [q0, q0 + groups).
template <bool XS>
__device__ __forceinline__ void stage_inputs(uint32_t* scale_lut, uint4* xs, int ldxs, const __nv_bfloat16* x,
                                             int64_t ldx, int64_t q0, int groups, int M, int tid, int nthreads) {
  for (int i = tid; i < 256; i += nthreads) {
    const __nv_bfloat16 sc = __float2bfloat16_rn(e4m3_to_float(i) * 0x1p118f);
    const uint32_t bits = __bfloat16_as_ushort(sc);
    scale_lut[i] = bits | (bits << 16);
  }
  if constexpr (XS) {
    for (int m = 0; m < M; ++m) {
      const uint4* xr = reinterpret_cast<const uint4*>(x + m * ldx) + q0;
      for (int q = tid; q < groups; q += nthreads) {
        const uint4 v = __ldg(xr + q);
        xs[m * ldxs + q] = make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                                      __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
      }
    }
  }
}

// Sums the warps' partials of tile n0 and writes y; with a split, into the cluster leader's split_sums instead. Call
// after the partials are visible to the calling threads, and before a split's cluster barrier (the leader must not
// be written to before every CTA of the cluster has started: barrier.cluster.arrive at entry, wait here).
template <int MT, int W>
__device__ __forceinline__ void reduce_tile(const float (&partial)[W][16][8 * MT], float (*split_sums)[16][16],
                                            float* y, int M, int64_t N, int64_t n0, int part, int ksplit,
                                            float out_scale, int tid, int nthreads) {
  float* leader = nullptr;
  if (ksplit > 1) {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    leader = cg::this_cluster().map_shared_rank(&split_sums[0][0][0], 0);
  }
  for (int i = tid; i < 16 * M; i += nthreads) {
    const int r = i & 15, m = i >> 4;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) sum += partial[w][r][m];
    if (ksplit > 1)
      leader[(part * 16 + m) * 16 + r] = sum;
    else if (n0 + r < N)
      y[m * N + n0 + r] = sum * out_scale;
  }
}

// The split's second half, by every thread of the cluster: the leader adds the parts in rank order.
__device__ __forceinline__ void finish_split(const float (*split_sums)[16][16], float* y, int M, int64_t N, int64_t n0,
                                             int part, int ksplit, float out_scale, int tid, int nthreads) {
  cg::this_cluster().sync();
  if (part != 0) return;
  for (int i = tid; i < 16 * M; i += nthreads) {
    const int r = i & 15, m = i >> 4;
    if (n0 + r >= N) continue;
    float sum = 0.0f;
    for (int p = 0; p < ksplit; ++p) sum += split_sums[p][m][r];
    y[m * N + n0 + r] = sum * out_scale;
  }
}

// Bulk-copy pipeline. MT: n8 tiles of the batch. W: consumer warps (warp W produces). XS: activations staged in
// shared memory. WHOLE: one stage holds the whole tile unpadded, so two copies move it (16 rows are contiguous).
// Dynamic shared memory: `slots` stages, then (XS) the CTA's share of the activations in the mma's k order.
template <int MT, int W, bool XS, bool PDL, bool WHOLE>
__global__ void __launch_bounds__((W + 1) * 32)
    nvfp4_gemv_bulk_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                           const float* __restrict__ tensor_scale, const __nv_bfloat16* __restrict__ x,
                           float* __restrict__ y, int M, int64_t N, int64_t blocks, int ksplit, int slots) {
  using namespace pipe;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full[kMaxSlots], empty[kMaxSlots];
  __shared__ uint32_t scale_lut[256];
  __shared__ float partial[W][16][8 * MT];
  __shared__ float split_sums[kMaxSplit][16][16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int part = static_cast<int>(blockIdx.x % ksplit);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / ksplit) * 16;
  const int64_t sb = WHOLE ? blocks : kStageBlocks;  // blocks per stage
  const int code_row = WHOLE ? static_cast<int>(blocks * 8) : kCodeRow;
  const int scale_row = WHOLE ? static_cast<int>(blocks) : kScaleRow;
  const int stage_bytes = WHOLE ? static_cast<int>(16 * blocks * 9) : kStageBytes;
  const int nst = static_cast<int>((blocks + sb - 1) / sb);
  const int st0 = part * nst / ksplit, my = (part + 1) * nst / ksplit - st0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], W);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if constexpr (PDL) asm volatile("griddepcontrol.launch_dependents;");
  if (ksplit > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  const float* ts = tensor_scale;

  if (warp == W) {
    // Producer. It touches only the weights, so it need not wait for the previous grid.
    if constexpr (WHOLE) {
      if (lane == 0) {
        const int rows = static_cast<int>(min(static_cast<int64_t>(16), N - n0));  // rows past N stay unread
        mbar_expect_tx(&full[0], static_cast<uint32_t>(rows * blocks * 9));
        bulk_copy(smem, codes + n0 * blocks * 8, static_cast<uint32_t>(rows * blocks * 8), &full[0]);
        bulk_copy(smem + 16 * code_row, scales + n0 * blocks, static_cast<uint32_t>(rows * blocks), &full[0]);
      }
    } else {
      const int r = lane & 15;
      const int64_t row = min(n0 + r, N - 1);  // rows past N read row N - 1 and are never stored
      for (int i = 0; i < my; ++i) {
        const int slot = i % slots;
        if (i >= slots) mbar_wait(&empty[slot], (i / slots - 1) & 1);
        const int64_t b0 = static_cast<int64_t>(st0 + i) * sb;
        const int nb = static_cast<int>(min(sb, blocks - b0));
        if (lane == 0) mbar_expect_tx(&full[slot], 16 * nb * 9);
        __syncwarp();
        uint8_t* stage = smem + slot * stage_bytes;
        if (lane < 16)
          bulk_copy(stage + r * code_row, codes + row * blocks * 8 + b0 * 8, nb * 8, &full[slot]);
        else
          bulk_copy(stage + 16 * code_row + r * scale_row, scales + row * blocks + b0, nb, &full[slot]);
      }
    }
    __syncwarp();
    if (ksplit > 1) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  } else {
    if constexpr (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
    const int64_t ldx = blocks * 16, q0 = static_cast<int64_t>(st0) * sb * 2;
    const int groups = static_cast<int>(min(static_cast<int64_t>(my) * sb, blocks - st0 * sb) * 2);
    const int ldxs = groups + 1;
    uint4* xs = reinterpret_cast<uint4*>(smem + slots * stage_bytes);
    stage_inputs<XS>(scale_lut, xs, ldxs, x, ldx, q0, groups, M, threadIdx.x, W * 32);
    asm volatile("bar.sync 1, %0;" ::"r"(W * 32) : "memory");

    float acc[2][MT][4] = {};
    for (int i = 0; i < my; ++i) {
      const int slot = i % slots;
      mbar_wait(&full[slot], (i / slots) & 1);
      const uint8_t* stage = smem + slot * stage_bytes;
      const int64_t b0 = static_cast<int64_t>(st0 + i) * sb;
      const int nb = static_cast<int>(min(sb, blocks - b0));
      for (int c = warp; c * 8 < nb; c += W)  // chunk: 8 blocks (128 k)
        chunk_mma<MT, XS>(stage + c * 64 + t * 16, code_row, stage + 16 * code_row + c * 8 + t * 2, scale_row,
                          scale_lut, xs, ldxs, q0, x, ldx, (b0 + c * 8 + 2 * t) * 2, M, g, acc);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    }
    store_partials<MT, W>(partial, acc, warp, g, t);
    asm volatile("bar.sync 1, %0;" ::"r"(W * 32) : "memory");
    reduce_tile<MT, W>(partial, split_sums, y, M, N, n0, part, ksplit, 256.0f * __ldg(ts), threadIdx.x, W * 32);
  }
  // 256: undo the 2^-8 folded into the BF16 weights.
  if (ksplit > 1) finish_split(split_sums, y, M, N, n0, part, ksplit, 256.0f * __ldg(ts), threadIdx.x, (W + 1) * 32);
}

// cp.async pipeline: every thread copies 16-byte pieces of stage i + SL - 1 while the warps compute stage i.
template <int MT, int W, bool XS, bool PDL, int SL>
__global__ void __launch_bounds__(W * 32)
    nvfp4_gemv_async_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                            const float* __restrict__ tensor_scale, const __nv_bfloat16* __restrict__ x,
                            float* __restrict__ y, int M, int64_t N, int64_t blocks, int ksplit) {
  using namespace pipe;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint32_t scale_lut[256];
  __shared__ float partial[W][16][8 * MT];
  __shared__ float split_sums[kMaxSplit][16][16];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int part = static_cast<int>(blockIdx.x % ksplit);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / ksplit) * 16;
  const int nst = static_cast<int>((blocks + kStageBlocks - 1) / kStageBlocks);
  const int st0 = part * nst / ksplit, my = (part + 1) * nst / ksplit - st0;
  if (ksplit > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");

  // A warp copies runs of 512 contiguous bytes of one row; rows past N read row N - 1 and are never stored.
  auto issue = [&](int i) {
    if (i < my) {
      uint8_t* stage = smem + (i % SL) * kStageBytes;
      const int64_t b0 = static_cast<int64_t>(st0 + i) * kStageBlocks;
      const int nb = static_cast<int>(min(static_cast<int64_t>(kStageBlocks), blocks - b0));
      const int cpr = nb / 2, spr = nb / 16;  // 16-byte pieces per row: codes, scales
      for (int p = tid; p < 16 * cpr; p += W * 32) {
        const int r = p / cpr, c = p - r * cpr;
        const int64_t row = min(n0 + r, N - 1);
        copy16(stage + r * kCodeRow + c * 16, codes + row * blocks * 8 + b0 * 8 + c * 16);
      }
      for (int p = tid; p < 16 * spr; p += W * 32) {
        const int r = p / spr, c = p - r * spr;
        const int64_t row = min(n0 + r, N - 1);
        copy16(stage + 16 * kCodeRow + r * kScaleRow + c * 16, scales + row * blocks + b0 + c * 16);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");  // empty groups keep the count uniform
  };
#pragma unroll
  for (int i = 0; i < SL - 1; ++i) issue(i);
  if constexpr (PDL) {
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  const int64_t ldx = blocks * 16, q0 = static_cast<int64_t>(st0) * kStageBlocks * 2;
  const int groups = static_cast<int>(min(static_cast<int64_t>(my) * kStageBlocks, blocks - st0 * kStageBlocks) * 2);
  const int ldxs = groups + 1;
  uint4* xs = reinterpret_cast<uint4*>(smem + SL * kStageBytes);
  stage_inputs<XS>(scale_lut, xs, ldxs, x, ldx, q0, groups, M, tid, W * 32);

  float acc[2][MT][4] = {};
  for (int i = 0; i < my; ++i) {
    asm volatile("cp.async.wait_group %0;" ::"n"(SL - 2) : "memory");
    __syncthreads();  // stage i is complete for every thread; the slot of stage i - 1 may be refilled
    issue(i + SL - 1);
    const uint8_t* stage = smem + (i % SL) * kStageBytes;
    const int64_t b0 = static_cast<int64_t>(st0 + i) * kStageBlocks;
    const int nb = static_cast<int>(min(static_cast<int64_t>(kStageBlocks), blocks - b0));
    for (int c = warp; c * 8 < nb; c += W)
      chunk_mma<MT, XS>(stage + c * 64 + t * 16, kCodeRow, stage + 16 * kCodeRow + c * 8 + t * 2, kScaleRow, scale_lut,
                        xs, ldxs, q0, x, ldx, (b0 + c * 8 + 2 * t) * 2, M, g, acc);
  }
  store_partials<MT, W>(partial, acc, warp, g, t);
  __syncthreads();
  const float out_scale = 256.0f * __ldg(tensor_scale);  // undo the 2^-8 folded into the BF16 weights
  reduce_tile<MT, W>(partial, split_sums, y, M, N, n0, part, ksplit, out_scale, tid, W * 32);
  if (ksplit > 1) finish_split(split_sums, y, M, N, n0, part, ksplit, out_scale, tid, W * 32);
}

// Launch attributes shared by the pipelined kernels: programmatic dependent launch, and a cluster per split tile.
// The caller has raised the kernel's dynamic shared-memory limit to kMaxDynamicSmem.
template <class Kernel, class... Args>
cudaError_t launch_pipelined(Kernel kernel, int threads, size_t smem, int64_t N, int ksplit, bool pdl,
                             cudaStream_t stream, Args... args) {
  if (smem > static_cast<size_t>(pipe::kMaxDynamicSmem)) return cudaErrorInvalidValue;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((N + 15) / 16 * ksplit));
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (ksplit > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(ksplit);
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// Activations staged per CTA: M rows of its share of k, plus one pad group per row.
inline size_t staged_bytes(bool xs, int M, int64_t blocks, int64_t stage_blocks, int ksplit) {
  const int64_t nst = (blocks + stage_blocks - 1) / stage_blocks, per = (nst + ksplit - 1) / ksplit;
  return xs ? static_cast<size_t>(M) * (std::min(per * stage_blocks, blocks) * 2 + 1) * 16 : 0;
}

template <int MT, int W, bool XS, bool PDL, bool WHOLE>
cudaError_t launch_bulk_kernel(int M, const uint8_t* codes, const uint8_t* scales, const float* ts,
                               const __nv_bfloat16* x, float* y, int64_t N, int64_t blocks, int ksplit, int slots,
                               cudaStream_t stream) {
  if (WHOLE) ksplit = slots = 1;
  const int64_t sb = WHOLE ? blocks : pipe::kStageBlocks;
  const size_t stage = WHOLE ? static_cast<size_t>(16 * blocks * 9) : pipe::kStageBytes;
  const size_t smem = slots * stage + staged_bytes(XS, M, blocks, sb, ksplit);
  auto kernel = nvfp4_gemv_bulk_kernel<MT, W, XS, PDL, WHOLE>;
  static const cudaError_t raised =  // once per instantiation
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pipe::kMaxDynamicSmem);
  if (raised != cudaSuccess) return raised;
  return launch_pipelined(kernel, (W + 1) * 32, smem, N, ksplit, PDL, stream, codes, scales, ts, x, y, M, N, blocks,
                          ksplit, slots);
}

template <int MT, int W, bool XS, bool PDL, int SL>
cudaError_t launch_async_kernel(int M, const uint8_t* codes, const uint8_t* scales, const float* ts,
                                const __nv_bfloat16* x, float* y, int64_t N, int64_t blocks, int ksplit,
                                cudaStream_t stream) {
  const size_t smem = SL * pipe::kStageBytes + staged_bytes(XS, M, blocks, pipe::kStageBlocks, ksplit);
  auto kernel = nvfp4_gemv_async_kernel<MT, W, XS, PDL, SL>;
  static const cudaError_t raised =  // once per instantiation
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pipe::kMaxDynamicSmem);
  if (raised != cudaSuccess) return raised;
  return launch_pipelined(kernel, W * 32, smem, N, ksplit, PDL, stream, codes, scales, ts, x, y, M, N, blocks, ksplit);
}

}  // namespace
}  // namespace slm::nvfp4::cuda

namespace {

using slm::nvfp4::cuda::launch_kernel;

void ck(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::printf("CUDA error %s at line %d: %s\n", cudaGetErrorString(e), line, what);
    std::exit(1);
  }
}
#define CK(x) ck((x), #x, __LINE__)

using slm::bench::time_graph;

double e2m1(int c) {
  static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -v[c & 7] : v[c & 7];
}
double e4m3(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
}

struct Problem {
  int64_t N, K, blocks;
  int copies;
  std::vector<uint8_t> codes_h, scales_h;
  std::vector<uint16_t> x_h;  // 16 rows of BF16 bits
  std::vector<uint8_t*> codes, scales;
  float* ts;
  __nv_bfloat16* x;
  float* y;
  double bytes() const { return static_cast<double>(N) * blocks * 9; }  // 8 code bytes + 1 scale byte per block
};

constexpr float kTensorScale = 0.75f;

Problem make_problem(int64_t N, int64_t K, std::mt19937& rng) {
  Problem p;
  p.N = N;
  p.K = K;
  p.blocks = (K + 15) / 16;
  p.copies = std::max(2, static_cast<int>(std::ceil(256.0 * 1048576 / p.bytes())));
  p.codes_h.resize(N * p.blocks * 8);
  p.scales_h.resize(N * p.blocks);
  for (auto& c : p.codes_h) c = rng() & 0xFF;
  for (auto& s : p.scales_h) s = 0x30 + rng() % 0x20;  // E4M3 0.5 .. 3.75
  for (int i = 0; i < p.copies; ++i) {
    uint8_t *c, *s;
    CK(cudaMalloc(&c, p.codes_h.size()));
    CK(cudaMalloc(&s, p.scales_h.size()));
    CK(cudaMemcpy(c, p.codes_h.data(), p.codes_h.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s, p.scales_h.data(), p.scales_h.size(), cudaMemcpyHostToDevice));
    p.codes.push_back(c);
    p.scales.push_back(s);
  }
  CK(cudaMalloc(&p.ts, 4));
  CK(cudaMemcpy(p.ts, &kTensorScale, 4, cudaMemcpyHostToDevice));
  p.x_h.resize(16 * p.blocks * 16);
  std::normal_distribution<float> normal;
  for (auto& v : p.x_h) {
    const float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  CK(cudaMalloc(&p.x, p.x_h.size() * 2));
  CK(cudaMemcpy(p.x, p.x_h.data(), p.x_h.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&p.y, 16 * N * 4));
  return p;
}

void free_problem(Problem& p) {
  for (auto c : p.codes) CK(cudaFree(c));
  for (auto s : p.scales) CK(cudaFree(s));
  CK(cudaFree(p.ts));
  CK(cudaFree(p.x));
  CK(cudaFree(p.y));
}

double max_error(const Problem& p, int M, int64_t row_step) {
  std::vector<float> y(M * p.N);
  CK(cudaMemcpy(y.data(), p.y, y.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int64_t n = 0; n < p.N; n += row_step) {
    for (int m = 0; m < M; ++m) {
      double sum = 0, mag = 0;
      for (int64_t b = 0; b < p.blocks; ++b) {
        const double sc = e4m3(p.scales_h[n * p.blocks + b]);
        for (int i = 0; i < 16; ++i) {
          const uint8_t byte = p.codes_h[(n * p.blocks + b) * 8 + i / 2];
          const uint32_t bits = static_cast<uint32_t>(p.x_h[m * p.blocks * 16 + b * 16 + i]) << 16;
          float xv;
          std::memcpy(&xv, &bits, 4);
          const double term = e2m1((i & 1) ? byte >> 4 : byte & 15) * sc * xv;
          sum += term;
          mag += std::fabs(term);
        }
      }
      const double e = std::fabs(y[m * p.N + n] - sum * kTensorScale) / (mag * kTensorScale + 1e-30);
      worst = std::isnan(e) ? 1e9 : std::max(worst, e);
    }
  }
  return worst;
}

// Times one configuration (enqueue(i) launches on weight copy i) and, when check_step > 0, checks every
// check_step-th row of its first launch.
template <class F>
void run_variant(const char* name, Problem& p, int M, cudaStream_t st, double bw, int64_t check_step, F&& enqueue) {
  double err = -1;
  if (check_step > 0) {
    CK(cudaMemset(p.y, 0xFF, 16 * p.N * 4));  // NaN: unwritten outputs fail the check
    enqueue(0);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    err = max_error(p, M, check_step);
  }
  const double t1 = time_graph(st, 64, enqueue, 0.15), t2 = time_graph(st, 64, enqueue, 0.15);
  const double t = std::min(t1, t2);
  std::printf("%-24s %6lld x %6lld M %2d | %7.2f us (%7.2f) %6.0f GB/s %5.1f%% |", name, static_cast<long long>(p.N),
              static_cast<long long>(p.K), M, t * 1e6, std::max(t1, t2) * 1e6, p.bytes() / t / 1e9,
              100 * p.bytes() / t / bw);
  if (err >= 0)
    std::printf(" err %.1e%s\n", err, err > 1e-5 ? "  WRONG" : "");
  else
    std::printf(" -\n");
  std::fflush(stdout);
}

// The register kernel (the path for K % 256 != 0).
template <int MT, int S, bool XS, int U, bool PDL>
void variant(const char* name, Problem& p, int M, cudaStream_t st, double bw, int64_t check_step) {
  const size_t static_bytes = 256 * 4 + S * 16 * 8 * MT * 4;
  const size_t staged = XS ? static_cast<size_t>(M) * (p.blocks * 2 + 1) * 16 : 0;
  if (staged + static_bytes > 48 * 1024) return;
  run_variant(name, p, M, st, bw, check_step, [&](int i) {
    CK((launch_kernel<2, MT, S, XS, U, PDL>(M, p.codes[i % p.copies], p.scales[i % p.copies], p.ts, p.x, p.y, p.N,
                                            p.blocks, staged, st)));
  });
}

// The bulk-copy pipeline (one producer warp) with an explicit split and ring size; WHOLE: two copies per tile.
template <int MT, int W, bool XS, bool PDL, bool WHOLE>
void bulk_variant(Problem& p, int M, cudaStream_t st, double bw, int64_t check_step, int ksplit, int slots) {
  const int64_t nst = (p.blocks + 63) / 64;
  if (!WHOLE && (ksplit > nst || slots > (nst + ksplit - 1) / ksplit)) return;
  if (WHOLE && 16 * p.blocks * 9 > 150 * 1024) return;
  char name[64];
  if (WHOLE)
    std::snprintf(name, sizeof name, "bulk W%d%s whole-tile%s", W, XS ? " XS" : "", PDL ? "" : " noPDL");
  else
    std::snprintf(name, sizeof name, "bulk W%d%s ks%d sl%d%s", W, XS ? " XS" : "", ksplit, slots, PDL ? "" : " noPDL");
  run_variant(name, p, M, st, bw, check_step, [&](int i) {
    CK((slm::nvfp4::cuda::launch_bulk_kernel<MT, W, XS, PDL, WHOLE>(M, p.codes[i % p.copies], p.scales[i % p.copies],
                                                                    p.ts, p.x, p.y, p.N, p.blocks, ksplit, slots, st)));
  });
}

// The cp.async pipeline (every thread copies) with SL stages and an explicit split.
template <int MT, int W, bool XS, bool PDL, int SL>
void async_variant(Problem& p, int M, cudaStream_t st, double bw, int64_t check_step, int ksplit) {
  const int64_t nst = (p.blocks + 63) / 64;
  if (ksplit > nst) return;
  char name[64];
  std::snprintf(name, sizeof name, "async W%d%s ks%d sl%d%s", W, XS ? " XS" : "", ksplit, SL, PDL ? "" : " noPDL");
  run_variant(name, p, M, st, bw, check_step, [&](int i) {
    CK((slm::nvfp4::cuda::launch_async_kernel<MT, W, XS, PDL, SL>(M, p.codes[i % p.copies], p.scales[i % p.copies],
                                                                  p.ts, p.x, p.y, p.N, p.blocks, ksplit, st)));
  });
}

// The launcher's own choice (what the model runs).
void shipped(Problem& p, int M, cudaStream_t st, double bw, int64_t check_step) {
  run_variant("gemv() (shipped)", p, M, st, bw, check_step, [&](int i) {
    const std::string e = slm::nvfp4::cuda::gemv(p.codes[i % p.copies], p.scales[i % p.copies], p.ts, p.x, p.y, M, p.N,
                                                 p.blocks, st, true);
    if (!e.empty()) {
      std::printf("gemv: %s\n", e.c_str());
      std::exit(1);
    }
  });
}

__global__ void empty_kernel(float* y) {
  if (threadIdx.x == 1000) y[0] = 1;
}

}  // namespace

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  double bw = 0;
  for (size_t mib : {1024, 64, 24, 16, 9}) {
    const size_t bytes = mib << 20;
    const int n = std::max<int>(2, static_cast<int>(512 / mib));
    std::vector<void*> bufs(n);
    for (auto& b : bufs) {
      CK(cudaMalloc(&b, bytes));
      CK(cudaMemset(b, 1, bytes));
    }
    unsigned* sink;
    CK(cudaMalloc(&sink, 4));
    const double t = time_graph(
        st, 16, [&](int i) { slm::bench::enqueue_read(bufs[i % n], bytes, sink, st); }, 0.3);
    std::printf("streaming read %5zu MiB: %7.2f us  %6.0f GB/s\n", mib, t * 1e6, bytes / t / 1e9);
    if (mib == 1024) bw = bytes / t;
    for (auto& b : bufs) CK(cudaFree(b));
    CK(cudaFree(sink));
  }
  {
    float* y;
    CK(cudaMalloc(&y, 4));
    const double t = time_graph(
        st, 64, [&](int) { empty_kernel<<<264, 256, 0, st>>>(y); }, 0.15);
    std::printf("empty kernel in a graph: %.2f us per launch\n\n", t * 1e6);
    CK(cudaFree(y));
  }
  std::mt19937 rng(1);
  struct Shape {
    int64_t n, k;
  };
  for (Shape s : {Shape{4096, 4096}, Shape{11008, 4096}, Shape{4096, 11008}, Shape{1024, 4096}, Shape{2064, 2304}}) {
    Problem p = make_problem(s.n, s.k, rng);
    const int64_t step = s.n > 4096 || s.k > 4096 ? 61 : 7;
    for (int M : {1, 4, 16}) {
      shipped(p, M, st, bw, step);
      if (M == 1) {
        variant<1, 16, true, 2, true>("register S16 XS U2", p, M, st, bw, step);
        variant<1, 16, true, 2, false>("register S16 XS U2 noPDL", p, M, st, bw, step);
        bulk_variant<1, 8, true, true, true>(p, M, st, bw, step, 1, 1);
        bulk_variant<1, 4, true, true, true>(p, M, st, bw, step, 1, 1);
        bulk_variant<1, 8, true, false, true>(p, M, st, bw, step, 1, 1);
        bulk_variant<1, 4, true, true, false>(p, M, st, bw, step, 1, 4);
        for (int ks : {1, 2, 4}) {
          async_variant<1, 8, true, true, 2>(p, M, st, bw, step, ks);
          async_variant<1, 8, true, true, 3>(p, M, st, bw, step, ks);
          async_variant<1, 8, true, true, 4>(p, M, st, bw, step, ks);
          async_variant<1, 4, true, true, 3>(p, M, st, bw, step, ks);
          async_variant<1, 4, true, true, 4>(p, M, st, bw, step, ks);
        }
        async_variant<1, 8, true, false, 3>(p, M, st, bw, step, 1);
        async_variant<1, 8, true, false, 3>(p, M, st, bw, step, 2);
        async_variant<1, 4, true, false, 4>(p, M, st, bw, step, 1);
      } else if (M <= 8) {
        variant<1, 16, false, 2, true>("register S16 U2", p, M, st, bw, step);
        bulk_variant<1, 8, false, true, true>(p, M, st, bw, step, 1, 1);
        for (int ks : {1, 2, 4}) {
          async_variant<1, 8, false, true, 3>(p, M, st, bw, step, ks);
          async_variant<1, 4, false, true, 4>(p, M, st, bw, step, ks);
        }
      } else {
        variant<2, 16, false, 2, true>("register MT2 S16 U2", p, M, st, bw, step);
        bulk_variant<2, 8, false, true, true>(p, M, st, bw, step, 1, 1);
        for (int ks : {1, 2, 4}) {
          async_variant<2, 8, false, true, 3>(p, M, st, bw, step, ks);
          async_variant<2, 4, false, true, 4>(p, M, st, bw, step, ks);
        }
      }
    }
    std::printf("\n");
    free_problem(p);
  }
  std::printf(
      "\n(bytes: 0.5 B of codes + 1/16 B of scale per weight; %% of the 1 GiB streaming read; PDL unless "
      "marked; XS: activations staged in shared memory)\n");
  return 0;
}
