// The fused cross-entropy of cross_entropy_kernels.h. One CTA per row: the forward reads the row once (an online
// max and sum of exponentials per thread, merged across the block), the backward reads it once more and writes the
// gradient in the logits' own type. Against the unfused path (the BF16 head output cast to an FP32 copy,
// log_softmax, its saved FP32 output and its backward, then the cast back) this moves about 6 bytes per logit
// instead of about 30, and keeps no FP32 copy of the [rows, vocab] logits alive between forward and backward.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "slm/ops/cuda/cross_entropy_kernels.h"
#include "slm/ops/cuda/element.cuh"

namespace slm::ops::cuda {
namespace {

constexpr int kThreads = 512;

// 16-byte packs: 8 bf16 or 4 float.
template <typename T>
struct Pack {
  static constexpr int n = 16 / sizeof(T);
  union {
    uint4 raw;
    T v[n];
  };
};

// Merges a running (max, sum of exp(x - max)) with another.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

__device__ __forceinline__ void block_reduce(float& m, float& s) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sm[warp] = m, ss[warp] = s;
  __syncthreads();
  m = lane < kThreads / 32 ? sm[lane] : -INFINITY;
  s = lane < kThreads / 32 ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets, int64_t vocab,
                   int64_t ignore_index, float* __restrict__ lse, float* __restrict__ loss) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  float m = -INFINITY, s = 0.f;
  if constexpr (kVector) {
    constexpr int n = Pack<T>::n;
    const uint4* p = reinterpret_cast<const uint4*>(x);
    for (int64_t i = threadIdx.x; i < vocab / n; i += kThreads) {
      Pack<T> pk;
      pk.raw = __ldg(p + i);
      float v[n], mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < n; ++j) v[j] = to_float(pk.v[j]), mx = fmaxf(mx, v[j]);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < n; ++j) sum += __expf(v[j] - mx);
      merge(m, s, mx, sum);
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) merge(m, s, to_float(x[i]), 1.f);
  }
  block_reduce(m, s);
  if (threadIdx.x == 0) {
    const float l = m + logf(s);
    lse[row] = l;
    const int64_t t = targets[row];
    if (t == ignore_index)
      loss[row] = 0.f;
    else if (t < 0 || t >= vocab)
      loss[row] = NAN;  // an out-of-range target poisons the loss instead of reading out of bounds
    else
      loss[row] = l - to_float(x[t]);
  }
}

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets, const float* __restrict__ lse,
                    const float* __restrict__ grad, const float* __restrict__ count, int64_t vocab,
                    int64_t ignore_index, T* __restrict__ dlogits) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  T* dx = dlogits + row * vocab;
  const int64_t t = targets[row];
  const bool kept = t != ignore_index;
  const float scale = kept ? grad[0] / count[0] : 0.f, l = lse[row];
  if constexpr (kVector) {
    constexpr int n = Pack<T>::n;
    const uint4* p = reinterpret_cast<const uint4*>(x);
    uint4* q = reinterpret_cast<uint4*>(dx);
    for (int64_t i = threadIdx.x; i < vocab / n; i += kThreads) {
      Pack<T> in, out;
      in.raw = __ldg(p + i);
#pragma unroll
      for (int j = 0; j < n; ++j) {
        const float pr = kept ? __expf(to_float(in.v[j]) - l) : 0.f;
        out.v[j] = from_float<T>((pr - (i * n + j == t ? 1.f : 0.f)) * scale);
      }
      q[i] = out.raw;
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float pr = kept ? __expf(to_float(x[i]) - l) : 0.f;
      dx[i] = from_float<T>((pr - (i == t ? 1.f : 0.f)) * scale);
    }
  }
}

template <typename T>
bool vectorizable(const void* a, const void* b, int64_t vocab) {
  constexpr int n = Pack<T>::n;
  return vocab % n == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

std::string status() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("cross_entropy kernel: ") + cudaGetErrorString(e);
}

template <typename T>
void launch_forward(const void* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t ignore_index,
                    float* lse, float* loss, cudaStream_t st) {
  const T* x = static_cast<const T*>(logits);
  if (vectorizable<T>(logits, logits, vocab))
    forward_kernel<T, true><<<rows, kThreads, 0, st>>>(x, targets, vocab, ignore_index, lse, loss);
  else
    forward_kernel<T, false><<<rows, kThreads, 0, st>>>(x, targets, vocab, ignore_index, lse, loss);
}

template <typename T>
void launch_backward(const void* logits, const int64_t* targets, const float* lse, const float* grad,
                     const float* count, int64_t rows, int64_t vocab, int64_t ignore_index, void* dlogits,
                     cudaStream_t st) {
  const T* x = static_cast<const T*>(logits);
  T* dx = static_cast<T*>(dlogits);
  if (vectorizable<T>(logits, dlogits, vocab))
    backward_kernel<T, true><<<rows, kThreads, 0, st>>>(x, targets, lse, grad, count, vocab, ignore_index, dx);
  else
    backward_kernel<T, false><<<rows, kThreads, 0, st>>>(x, targets, lse, grad, count, vocab, ignore_index, dx);
}

}  // namespace

std::string cross_entropy_forward(LogitType type, const void* logits, const int64_t* targets, int64_t rows,
                                  int64_t vocab, int64_t ignore_index, float* lse, float* loss, void* stream) {
  if (rows == 0) return {};
  auto st = static_cast<cudaStream_t>(stream);
  if (type == LogitType::kBFloat16)
    launch_forward<__nv_bfloat16>(logits, targets, rows, vocab, ignore_index, lse, loss, st);
  else
    launch_forward<float>(logits, targets, rows, vocab, ignore_index, lse, loss, st);
  return status();
}

std::string cross_entropy_backward(LogitType type, const void* logits, const int64_t* targets, const float* lse,
                                   const float* grad, const float* count, int64_t rows, int64_t vocab,
                                   int64_t ignore_index, void* dlogits, void* stream) {
  if (rows == 0) return {};
  auto st = static_cast<cudaStream_t>(stream);
  if (type == LogitType::kBFloat16)
    launch_backward<__nv_bfloat16>(logits, targets, lse, grad, count, rows, vocab, ignore_index, dlogits, st);
  else
    launch_backward<float>(logits, targets, lse, grad, count, rows, vocab, ignore_index, dlogits, st);
  return status();
}

}  // namespace slm::ops::cuda
