// The MoE's combine for training in one kernel each way: a warp per token reads its k expert rows through the inverse
// permutation (16-byte vectors) and writes the gated sum; the backward writes each expert row's gradient and the k gate
// gradients (warp dot products) from one read of the token's output gradient. The tensor-op form gathers the rows into
// a [tokens, k, d] copy, multiplies it (a second copy), sums it and keeps the first copy for the backward.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/moe_combine_kernel.h"

namespace slm::ops::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

// Token n's k assignments: the offset of each one's row in ys and its gate rounded to T (as the tensor ops cast it).
template <class T>
__device__ __forceinline__ void token_slots(const int64_t* inv, const float* w, int64_t n, int k, int64_t d,
                                            int64_t (&row)[kMoeCombineMaxK], float (&gate)[kMoeCombineMaxK]) {
  const T* tag = nullptr;
#pragma unroll
  for (int j = 0; j < kMoeCombineMaxK; ++j)
    if (j < k) row[j] = inv[n * k + j] * d, gate[j] = round_to(w[n * k + j], tag);
}

template <class T>
struct Vec {
  static constexpr int kSize = 16 / sizeof(T);  // elements per 16-byte load
  T v[kSize];
};

template <class T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  Vec<T> out;
  *reinterpret_cast<uint4*>(out.v) = *reinterpret_cast<const uint4*>(p);
  return out;
}

template <class T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& v) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(v.v);
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    combine_forward_kernel(const T* __restrict__ ys, const int64_t* __restrict__ inv, const float* __restrict__ w,
                           T* __restrict__ out, int64_t tokens, int k, int64_t d) {
  constexpr int V = Vec<T>::kSize;
  const T* tag = nullptr;
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= tokens) return;
  int64_t row[kMoeCombineMaxK];
  float gate[kMoeCombineMaxK];
  token_slots<T>(inv, w, n, k, d, row, gate);
  for (int64_t c = static_cast<int64_t>(lane) * V; c < d; c += 32 * V) {
    float acc[V] = {};
#pragma unroll
    for (int j = 0; j < kMoeCombineMaxK; ++j) {
      if (j >= k) break;
      const Vec<T> y = load_vec(ys + row[j] + c);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = __fadd_rn(acc[e], round_to(__fmul_rn(gate[j], load(y.v + e)), tag));
    }
    Vec<T> o;
#pragma unroll
    for (int e = 0; e < V; ++e) store(o.v + e, acc[e]);
    store_vec(out + n * d + c, o);
  }
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    combine_backward_kernel(const T* __restrict__ g, const T* __restrict__ ys, const int64_t* __restrict__ inv,
                            const float* __restrict__ w, T* __restrict__ dys, float* __restrict__ dw, int64_t tokens,
                            int k, int64_t d) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= tokens) return;
  int64_t row[kMoeCombineMaxK];
  float gate[kMoeCombineMaxK], dot[kMoeCombineMaxK] = {};
  token_slots<T>(inv, w, n, k, d, row, gate);
  for (int64_t c = static_cast<int64_t>(lane) * V; c < d; c += 32 * V) {
    const Vec<T> gv = load_vec(g + n * d + c);
#pragma unroll
    for (int j = 0; j < kMoeCombineMaxK; ++j) {
      if (j >= k) break;
      const Vec<T> y = load_vec(ys + row[j] + c);
      Vec<T> dy;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float ge = load(gv.v + e);
        store(dy.v + e, __fmul_rn(ge, gate[j]));
        dot[j] = fmaf(ge, load(y.v + e), dot[j]);
      }
      store_vec(dys + row[j] + c, dy);
    }
  }
#pragma unroll
  for (int j = 0; j < kMoeCombineMaxK; ++j) {
    if (j >= k) break;
    const float s = warp_sum(dot[j]);
    if (lane == 0) dw[n * k + j] = s;
  }
}

unsigned blocks_for(int64_t tokens) {
  return static_cast<unsigned>((tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

std::string launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

std::string check(DecodeDtype dtype, int k, int64_t d) {
  if (k < 1 || k > kMoeCombineMaxK) return "moe combine: k must be 1.." + std::to_string(kMoeCombineMaxK);
  if (dtype == DecodeDtype::kHalf) return "moe combine: FP32 or BF16 rows only";
  if (d % (dtype == DecodeDtype::kFloat ? 4 : 8)) return "moe combine: rows must be whole 16-byte vectors";
  return {};
}

}  // namespace

std::string moe_combine_forward(DecodeDtype dtype, const void* ys, const int64_t* inv, const float* w, void* out,
                                int64_t tokens, int k, int64_t d, void* stream) {
  if (auto e = check(dtype, k, d); !e.empty()) return e;
  if (tokens == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DecodeDtype::kFloat)
    combine_forward_kernel<float><<<blocks_for(tokens), kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const float*>(ys), inv, w, static_cast<float*>(out), tokens, k, d);
  else
    combine_forward_kernel<__nv_bfloat16><<<blocks_for(tokens), kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const __nv_bfloat16*>(ys), inv, w, static_cast<__nv_bfloat16*>(out), tokens, k, d);
  return launched("moe combine forward");
}

std::string moe_combine_backward(DecodeDtype dtype, const void* g, const void* ys, const int64_t* inv, const float* w,
                                 void* dys, float* dw, int64_t tokens, int k, int64_t d, void* stream) {
  if (auto e = check(dtype, k, d); !e.empty()) return e;
  if (tokens == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DecodeDtype::kFloat)
    combine_backward_kernel<float>
        <<<blocks_for(tokens), kWarpsPerBlock * 32, 0, s>>>(static_cast<const float*>(g), static_cast<const float*>(ys),
                                                            inv, w, static_cast<float*>(dys), dw, tokens, k, d);
  else
    combine_backward_kernel<__nv_bfloat16><<<blocks_for(tokens), kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const __nv_bfloat16*>(g), static_cast<const __nv_bfloat16*>(ys), inv, w,
        static_cast<__nv_bfloat16*>(dys), dw, tokens, k, d);
  return launched("moe combine backward");
}

}  // namespace slm::ops::cuda
