// The keys a DSA layer's decode step attends to, as a mask, in one kernel: the set model::dsa_select_at lists.
//
// Why: dsa_select_at ranks the scores with a stable sort over the whole cache and about fifteen small tensor ops
// around it (masks, the count k(p), the cut), and the sparse attention then gathers the selected rows. In the 6B cmake
// specialist's decode step that was ~25 launches per DSA layer, the sort alone 18 us (bench/RESULTS.md). Attention
// does not depend on the order of its keys, so the step needs only the set: the k(p) largest ranks, ties broken
// toward the lower position as the stable sort breaks them.
//
// One CTA per row. Ranks become unsigned keys that order like the floats (forced keys, inside the local window, are
// the largest key). A radix select, 8 bits a round from the top, finds the k(p)-th largest key τ and how many keys
// equal to τ the set still takes; a last pass keeps every key above τ and the first of those equal to τ in position
// order (a block-wide prefix count).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/dsa_select_kernel.h"
#include "slm/ops/cuda/element.cuh"

namespace slm::ops::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr uint32_t kForced = 0xffffffffu;

// Unsigned key with the order of the float: larger score, larger key; -0 and +0 equal, as the sort compares them.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t bits = __float_as_uint(f);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    dsa_keep_kernel(const T* __restrict__ scores, const int64_t* __restrict__ positions, int64_t keys, double ratio,
                    int64_t local_window, int64_t window, uint8_t* __restrict__ keep) {
  __shared__ unsigned hist[256];
  __shared__ unsigned warp_count[kWarps];
  __shared__ unsigned s_digit, s_left;
  const int64_t b = blockIdx.x;
  const T* sc = scores + b * keys;
  uint8_t* out = keep + b * keys;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t p = positions[b];
  const int64_t first = window > 0 ? max(int64_t{0}, p - window + 1) : 0;
  // k(p), as model::dsa_keys_per_query computes it in double (no contraction into an FMA, which rounds once less).
  const int64_t seen = p + 1 - first;
  const auto by_ratio = static_cast<int64_t>(floor(__dadd_rn(__dmul_rn(static_cast<double>(seen), ratio), 1e-9)));
  const int64_t take = min(seen, max(by_ratio, local_window));
  const auto key = [&](int64_t j) { return p - j < local_window ? kForced : order_key(load(sc + j)); };

  // τ, 8 bits a round from the top: the digit where the count of keys above, from the largest digit down, reaches
  // what is left to take.
  uint32_t prefix = 0, mask = 0;
  unsigned left = static_cast<unsigned>(take);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int64_t j = first + tid; j <= p; j += kThreads) {
      const uint32_t u = key(j);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds digits 255 - 8l .. 248 - 8l, largest first.
      unsigned c[8], sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += (c[i] = hist[255 - (lane * 8 + i)]);
      unsigned incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
      }
      const unsigned before = incl - sum;
      if (before < left && left <= incl) {
        unsigned cum = before;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (cum + c[i] >= left) {
            s_digit = 255u - static_cast<unsigned>(lane * 8 + i);
            s_left = left - cum;
            break;
          }
          cum += c[i];
        }
      }
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 0xFFu << shift;
    left = s_left;
    __syncthreads();  // s_digit and hist are rewritten by the next round
  }

  // Every key above τ, and the first `left` keys equal to τ in position order.
  unsigned running = 0;
  for (int64_t base = first; base <= p; base += kThreads) {
    const int64_t j = base + tid;
    const bool valid = j <= p;
    const uint32_t u = valid ? key(j) : 0;
    const bool eq = valid && u == prefix;
    const unsigned ballot = __ballot_sync(kFull, eq);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    unsigned rank = running + __popc(ballot & ((1u << lane) - 1u)), total = 0;
    for (int w = 0; w < kWarps; ++w) {
      const unsigned c = warp_count[w];
      if (w < warp) rank += c;
      total += c;
    }
    if (valid) out[j] = (u > prefix || (eq && rank < left)) ? 1 : 0;
    running += total;
    __syncthreads();  // warp_count is rewritten by the next chunk
  }
  for (int64_t j = tid; j < keys; j += kThreads)
    if (j < first || j > p) out[j] = 0;
}

template <class T>
std::string launch(const void* scores, const int64_t* positions, int64_t batch, int64_t keys, double ratio,
                   int64_t local_window, int64_t window, uint8_t* keep, cudaStream_t stream) {
  dsa_keep_kernel<T><<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(static_cast<const T*>(scores), positions,
                                                                            keys, ratio, local_window, window, keep);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("DSA keep kernel: ") + cudaGetErrorString(e);
}

}  // namespace

std::string dsa_keep_step(DecodeDtype dtype, const void* scores, const int64_t* positions, int64_t batch, int64_t keys,
                          double ratio, int64_t local_window, int64_t window, uint8_t* keep, void* stream) {
  if (batch == 0 || keys == 0) return "";
  if (batch > 0x7FFFFFFF) return "DSA keep kernel: too many rows";
  const auto s = static_cast<cudaStream_t>(stream);
  return with_element_type(dtype, [&](auto tag) {
    return launch<TagType<decltype(tag)>>(scores, positions, batch, keys, ratio, local_window, window, keep, s);
  });
}

}  // namespace slm::ops::cuda
