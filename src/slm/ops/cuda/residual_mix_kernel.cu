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

// Ty: y's type, which training (an FP32 stream, BF16 block outputs under autocast) may give apart from the others'.
template <class T, class Ty = T>
__global__ void residual_mix_kernel(const T* __restrict__ x, const Ty* __restrict__ y, const T* __restrict__ r,
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

template <class T, class Ty = T>
std::string launch(const void* x, const void* y, const void* r, const void* x0, const void* b, void* out, int64_t n,
                   cudaStream_t stream) {
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  residual_mix_kernel<T, Ty><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const Ty*>(y),
                                                              static_cast<const T*>(r), static_cast<const T*>(x0),
                                                              static_cast<const T*>(b), static_cast<T*>(out), n);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("residual mix kernel: ") + cudaGetErrorString(e);
}

constexpr int kBackwardThreads = 256;

// The mix's gradients for an FP32 stream: gx = r g, gy = r g rounded to y's type, gx0 = b g (the products the tensor
// ops' backward forms), and per block the partial sums of g (x + y) and g x0 (r's and b's gradients, summed by the
// caller: a fixed grid, so the sums do not depend on timing).
template <class Ty>
__global__ void __launch_bounds__(kBackwardThreads)
    residual_mix_backward_kernel(const float* __restrict__ g, const float* __restrict__ x, const Ty* __restrict__ y,
                                 const float* __restrict__ r, const float* __restrict__ x0, const float* __restrict__ b,
                                 float* __restrict__ gx, Ty* __restrict__ gy, float* __restrict__ gx0,
                                 float* __restrict__ partials, int64_t n) {
  const float rv = *r, bv = *b;
  float sr = 0.f, sb = 0.f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gv = g[i], xv = y ? __fadd_rn(x[i], load(y + i)) : x[i], rg = __fmul_rn(rv, gv);
    gx[i] = rg;
    if (y) store(gy + i, rg);
    gx0[i] = __fmul_rn(bv, gv);
    sr = fmaf(gv, xv, sr);
    sb = fmaf(gv, x0[i], sb);
  }
  __shared__ float warp_sums[kBackwardThreads / 32][2];
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    sr += __shfl_xor_sync(0xffffffffu, sr, o);
    sb += __shfl_xor_sync(0xffffffffu, sb, o);
  }
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32][0] = sr, warp_sums[threadIdx.x / 32][1] = sb;
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.f, c = 0.f;
    for (int w = 0; w < kBackwardThreads / 32; ++w) a += warp_sums[w][0], c += warp_sums[w][1];
    partials[2 * blockIdx.x] = a;
    partials[2 * blockIdx.x + 1] = c;
  }
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
  return with_element_type(dtype, [&](auto tag) {
    return launch_add_mean<TagType<decltype(tag)>>(x, y, out, mean, rows, static_cast<int>(n), d,
                                                   static_cast<cudaStream_t>(stream));
  });
}

std::string residual_mix(DecodeDtype dtype, const void* x, const void* y, const void* r, const void* x0, const void* b,
                         void* out, int64_t n, void* stream) {
  if (n == 0) return "";
  return with_element_type(dtype, [&](auto tag) {
    return launch<TagType<decltype(tag)>>(x, y, r, x0, b, out, n, static_cast<cudaStream_t>(stream));
  });
}

std::string residual_mix_train(DecodeDtype y_dtype, const float* x, const void* y, const float* r, const float* x0,
                               const float* b, float* out, int64_t n, void* stream) {
  if (n == 0) return "";
  return with_element_type(y_dtype, [&](auto tag) {
    return launch<float, TagType<decltype(tag)>>(x, y, r, x0, b, out, n, static_cast<cudaStream_t>(stream));
  });
}

int64_t residual_mix_backward_blocks(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>((n + kBackwardThreads - 1) / kBackwardThreads, 1024));
}

std::string residual_mix_backward(DecodeDtype y_dtype, const float* g, const float* x, const void* y, const float* r,
                                  const float* x0, const float* b, float* gx, void* gy, float* gx0, float* partials,
                                  int64_t n, void* stream) {
  const auto blocks = static_cast<unsigned>(residual_mix_backward_blocks(n));
  with_element_type(y_dtype, [&](auto tag) {
    using Ty = TagType<decltype(tag)>;
    residual_mix_backward_kernel<Ty><<<blocks, kBackwardThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        g, x, static_cast<const Ty*>(y), r, x0, b, gx, static_cast<Ty*>(gy), gx0, partials, n);
  });
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("residual mix backward kernel: ") + cudaGetErrorString(e);
}

}  // namespace slm::ops::cuda
