// The residual stream's per-layer mix r * (x + y) + b * x0 (nanochat's lambdas after the previous layer's output y)
// in one kernel instead of four (the sum, two products and their sum), rounding to the dtype after each as those tensor
// ops do, so the values are theirs bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/residual_mix_kernel.h"

namespace slm::ops::cuda {

namespace {

template <class T>
__global__ void residual_mix_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ r,
                                    const T* __restrict__ x0, const T* __restrict__ b, T* __restrict__ out, int64_t n) {
  const float rv = load(r), bv = load(b);
  const T* tag = nullptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // _rn: no contraction into an FMA, which would skip the product's rounding that the tensor ops do in FP32.
    const float xv = y ? round_to(__fadd_rn(load(x + i), load(y + i)), tag) : load(x + i);
    store(out + i, __fadd_rn(round_to(__fmul_rn(rv, xv), tag), round_to(__fmul_rn(bv, load(x0 + i)), tag)));
  }
}

template <class T>
std::string launch(const void* x, const void* y, const void* r, const void* x0, const void* b, void* out, int64_t n,
                   cudaStream_t stream) {
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  residual_mix_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(y),
                                                          static_cast<const T*>(r), static_cast<const T*>(x0),
                                                          static_cast<const T*>(b), static_cast<T*>(out), n);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("residual mix kernel: ") + cudaGetErrorString(e);
}

// One thread per (row, column): the n streams' sums, then their mean.
template <class T>
__global__ void stream_add_mean_kernel(const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ out,
                                       T* __restrict__ mean, int64_t rows, int n, int64_t d, float inv_n) {
  const T* tag = nullptr;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * d;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, j = e % d;
    const float yv = load(y + e);
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int64_t at = (r * n + i) * d + j;
      const float o = round_to(__fadd_rn(load(x + at), yv), tag);
      store(out + at, o);
      sum = __fadd_rn(sum, o);
    }
    store(mean + e, __fmul_rn(sum, inv_n));
  }
}

template <class T>
std::string launch_add_mean(const void* x, const void* y, void* out, void* mean, int64_t rows, int n, int64_t d,
                            cudaStream_t stream) {
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((rows * d + kThreads - 1) / kThreads, 4096));
  stream_add_mean_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(y),
                                                             static_cast<T*>(out), static_cast<T*>(mean), rows, n, d,
                                                             1.0f / static_cast<float>(n));
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("stream add-mean kernel: ") + cudaGetErrorString(e);
}

}  // namespace

std::string stream_add_mean(DecodeDtype dtype, const void* x, const void* y, void* out, void* mean, int64_t rows,
                            int64_t n, int64_t d, void* stream) {
  if (rows == 0 || d == 0 || n == 0) return "";
  if (n > 1024) return "stream add-mean kernel: too many streams";
  const auto s = static_cast<cudaStream_t>(stream);
  const int ni = static_cast<int>(n);
  switch (dtype) {
    case DecodeDtype::kFloat: return launch_add_mean<float>(x, y, out, mean, rows, ni, d, s);
    case DecodeDtype::kBFloat16: return launch_add_mean<__nv_bfloat16>(x, y, out, mean, rows, ni, d, s);
    case DecodeDtype::kHalf: return launch_add_mean<__half>(x, y, out, mean, rows, ni, d, s);
  }
  return "stream add-mean kernel: unknown dtype";
}

std::string residual_mix(DecodeDtype dtype, const void* x, const void* y, const void* r, const void* x0, const void* b,
                         void* out, int64_t n, void* stream) {
  if (n == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DecodeDtype::kFloat: return launch<float>(x, y, r, x0, b, out, n, s);
    case DecodeDtype::kBFloat16: return launch<__nv_bfloat16>(x, y, r, x0, b, out, n, s);
    case DecodeDtype::kHalf: return launch<__half>(x, y, r, x0, b, out, n, s);
  }
  return "residual mix kernel: unknown dtype";
}

}  // namespace slm::ops::cuda
