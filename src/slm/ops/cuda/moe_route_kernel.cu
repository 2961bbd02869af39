// MoE routing of a few tokens in one kernel, one warp per token: sigmoid affinities, top-k of affinity + balancing
// bias, and the gate weights from the unbiased affinities. Then the assignments' order by expert for the grouped
// experts, in one CTA.
//
// Why: as tensor ops routing is about eight kernels per MoE layer (sigmoid, the bias add, topk, gather, sum, divide,
// scale), each a few microseconds of GPU time for one [1, experts] row in a decode step (bench/RESULTS.md). The order
// by expert was a stable radix sort, searchsorted, arange, scatter and a division: 26 us of the sort alone per layer
// for the 256 assignments of a 64-row hybrid-250m step on an H200.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/moe_route_kernel.h"

namespace slm::ops::cuda {

namespace {

// kPerLane experts per lane, the fewest that cover the experts: the selection loops run over registers alone.
template <int kPerLane>
__global__ void moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                 int64_t* __restrict__ experts_out, float* __restrict__ weights_out, int experts, int k,
                                 float scaling) {
  const int64_t token = blockIdx.x;
  const int lane = threadIdx.x;
  const float* row = logits + token * experts;
  // Lane l holds experts l, l + 32, ...: its affinities and biased scores in registers.
  float score[kPerLane], biased[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    score[j] = e < experts ? 1.0f / (1.0f + expf(-row[e])) : 0.0f;
    biased[j] = e < experts ? score[j] + bias[e] : -INFINITY;
  }
  float picked[kMoeRouteMaxTopK];
  float total = 0.0f;
  for (int slot = 0; slot < k; ++slot) {
    // This lane's best unpicked expert, then the warp's: the larger score wins, the lower index on a tie.
    float best = -INFINITY, best_score = 0.0f;
    int best_e = experts;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < experts && (biased[j] > best || (biased[j] == best && e < best_e))) {
        best = biased[j];
        best_e = e;
        best_score = score[j];
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, o);
      const int other_e = __shfl_xor_sync(0xffffffffu, best_e, o);
      const float other_score = __shfl_xor_sync(0xffffffffu, best_score, o);
      if (other > best || (other == best && other_e < best_e)) {
        best = other;
        best_e = other_e;
        best_score = other_score;
      }
    }
    // The owner drops the winner from its candidates.
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j == best_e) biased[j] = -INFINITY;
    picked[slot] = best_score;
    total += best_score;
    if (lane == 0) experts_out[token * k + slot] = best_e;
  }
  if (lane == 0)
    for (int slot = 0; slot < k; ++slot) weights_out[token * k + slot] = picked[slot] / total * scaling;
}

constexpr int kOrderThreads = 1024;

// A counting sort in shared memory: counts per expert, their running sum, then each assignment's rank among the
// earlier assignments of its expert (a scan of the ids before it: at most kExpertOrderMaxAssignments reads of a
// broadcast shared-memory word).
__global__ void __launch_bounds__(kOrderThreads)
    expert_order_kernel(const int64_t* __restrict__ experts, int m, int k, int num_experts, int64_t* __restrict__ order,
                        int64_t* __restrict__ inv, int64_t* __restrict__ token, int32_t* __restrict__ ends) {
  extern __shared__ int shared[];
  int* ids = shared;     // [m]
  int* start = ids + m;  // [num_experts]: counts, then where each expert's rows start
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) start[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += blockDim.x) {
    ids[i] = static_cast<int>(experts[i]);
    atomicAdd(&start[ids[i]], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int e = 0; e < num_experts; ++e) {
      const int count = start[e];
      start[e] = run;
      run += count;
      ends[e] = run;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += blockDim.x) {
    const int e = ids[i];
    int rank = 0;
    for (int j = 0; j < i; ++j) rank += ids[j] == e;
    const int at = start[e] + rank;
    order[at] = i;
    inv[i] = at;
    token[at] = i / k;
  }
}

}  // namespace

std::string expert_order(const int64_t* experts, int64_t assignments, int64_t k, int64_t num_experts, int64_t* order,
                         int64_t* inv, int64_t* token, int32_t* ends, void* stream) {
  if (assignments < 1 || assignments > kExpertOrderMaxAssignments || k < 1 || num_experts < 1 ||
      num_experts > kMoeRouteMaxExperts)
    return "expert order kernel: " + std::to_string(assignments) + " assignments over " + std::to_string(num_experts) +
           " experts (up to " + std::to_string(kExpertOrderMaxAssignments) + " and " +
           std::to_string(kMoeRouteMaxExperts) + ")";
  const size_t smem = sizeof(int) * static_cast<size_t>(assignments + num_experts);
  expert_order_kernel<<<1, kOrderThreads, smem, static_cast<cudaStream_t>(stream)>>>(
      experts, static_cast<int>(assignments), static_cast<int>(k), static_cast<int>(num_experts), order, inv, token,
      ends);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("expert order kernel: ") + cudaGetErrorString(e);
}

std::string moe_route(const float* logits, const float* bias, int64_t* experts_out, float* weights_out, int64_t tokens,
                      int64_t experts, int64_t k, float scaling, void* stream) {
  if (tokens == 0) return "";
  if (experts < 1 || experts > kMoeRouteMaxExperts || k < 1 || k > experts || k > kMoeRouteMaxTopK)
    return "moe route kernel: " + std::to_string(experts) + " experts top-" + std::to_string(k) + " (up to " +
           std::to_string(kMoeRouteMaxExperts) + " experts, top-" + std::to_string(kMoeRouteMaxTopK) + ")";
  const auto launch = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(tokens), 32, 0, static_cast<cudaStream_t>(stream)>>>(
        logits, bias, experts_out, weights_out, static_cast<int>(experts), static_cast<int>(k), scaling);
  };
  const int64_t per_lane = (experts + 31) / 32;
  if (per_lane <= 1)
    launch(moe_route_kernel<1>);
  else if (per_lane <= 2)
    launch(moe_route_kernel<2>);
  else if (per_lane <= 4)
    launch(moe_route_kernel<4>);
  else if (per_lane <= 8)
    launch(moe_route_kernel<8>);
  else if (per_lane <= 16)
    launch(moe_route_kernel<16>);
  else
    launch(moe_route_kernel<32>);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("moe route kernel: ") + cudaGetErrorString(e);
}

}  // namespace slm::ops::cuda
