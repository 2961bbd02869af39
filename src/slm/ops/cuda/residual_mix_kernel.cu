// The residual stream's per-layer mix r * (x + y) + b * x0 (nanochat's lambdas after the previous layer's output y)
// in one kernel instead of four (the sum, two products and their sum), rounding to the dtype after each as those tensor
// ops do, so the values are theirs bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

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

// Training's mix followed by the next layer's pre-norm: a warp per row of d FP32 elements (d a multiple of 4,
// d <= 128 * kVec), each lane holding kVec float4s of it in registers between the mix and the norm.
constexpr int kNormWarps = 8;

template <class T>
__device__ __forceinline__ float4 load4(const T* p) {
  return make_float4(load(p), load(p + 1), load(p + 2), load(p + 3));
}
__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
template <class T>
__device__ __forceinline__ void store4(T* p, float4 v) {
  store(p, v.x), store(p + 1, v.y), store(p + 2, v.z), store(p + 3, v.w);
}
__device__ __forceinline__ void store4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}

template <class T, int kVec>
__global__ void __launch_bounds__(kNormWarps * 32)
    residual_mix_norm_kernel(const float* __restrict__ x, const T* __restrict__ y, const float* __restrict__ r,
                             const float* __restrict__ x0, const float* __restrict__ b, const float* __restrict__ w,
                             float eps, float* __restrict__ out, T* __restrict__ h, float* __restrict__ rstd,
                             int64_t rows, int d) {
  const float rv = *r, bv = *b;
  const int lane = threadIdx.x % 32;
  const float* tag = nullptr;  // the stream is FP32: the mix rounds as FP32 tensor ops do
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kNormWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kNormWarps) {
    const int64_t base = row * d;
    float4 o[kVec];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int j = (k * 32 + lane) * 4;
      if (j >= d) break;
      const float4 xv = load4(x + base + j), x0v = load4(x0 + base + j);
      float4 s = xv;
      if (y) {
        const float4 yv = load4(y + base + j);
        s = make_float4(__fadd_rn(xv.x, yv.x), __fadd_rn(xv.y, yv.y), __fadd_rn(xv.z, yv.z), __fadd_rn(xv.w, yv.w));
      }
      // _rn as in residual_mix_kernel: the tensor ops round each product before the sum.
      auto mix = [&](float sv, float x0e) {
        return __fadd_rn(round_to(__fmul_rn(rv, sv), tag), round_to(__fmul_rn(bv, x0e), tag));
      };
      o[k] = make_float4(mix(s.x, x0v.x), mix(s.y, x0v.y), mix(s.z, x0v.z), mix(s.w, x0v.w));
      store4(out + base + j, o[k]);
      ss += o[k].x * o[k].x + o[k].y * o[k].y + o[k].z * o[k].z + o[k].w * o[k].w;
    }
    const float inv = rsqrtf(warp_sum(ss) / static_cast<float>(d) + eps);
    if (lane == 0) rstd[row] = inv;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int j = (k * 32 + lane) * 4;
      if (j >= d) break;
      const float4 wv = load4(w + j);
      store4(h + base + j,
             make_float4(o[k].x * inv * wv.x, o[k].y * inv * wv.y, o[k].z * inv * wv.z, o[k].w * inv * wv.w));
    }
  }
}

// The backward of both: the norm's input gradient gout + rstd (gw - x̂ mean(gw x̂)) with x̂ = out rstd and
// gw = gh w, then the mix's gradients from that sum as residual_mix_backward_kernel forms them. Per block, the
// partials [d + 2]: the weight's gradient sum gh x̂ over the block's rows, then r's and b's sums. Each warp keeps its
// share of the weight's sum in registers and the warps add theirs in a fixed order, so the sums do not depend on
// timing.
template <class T, int kVec>
__global__ void __launch_bounds__(kNormWarps * 32)
    residual_mix_norm_backward_kernel(const float* __restrict__ gout, const T* __restrict__ gh,
                                      const float* __restrict__ out, const float* __restrict__ rstd,
                                      const float* __restrict__ w, const float* __restrict__ x, const T* __restrict__ y,
                                      const float* __restrict__ r, const float* __restrict__ x0,
                                      const float* __restrict__ b, float* __restrict__ gx, T* __restrict__ gy,
                                      float* __restrict__ gx0, float* __restrict__ partials, int64_t rows, int d) {
  const float rv = *r, bv = *b;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float4 dw[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) dw[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  float sr = 0.f, sb = 0.f;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kNormWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kNormWarps) {
    const int64_t base = row * d;
    const float inv = rstd[row];
    float dot = 0.f;
    if (gh) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int j = (k * 32 + lane) * 4;
        if (j >= d) break;
        const float4 g4 = load4(gh + base + j), o4 = load4(out + base + j), w4 = load4(w + j);
        dot += g4.x * w4.x * o4.x + g4.y * w4.y * o4.y + g4.z * w4.z * o4.z + g4.w * w4.w * o4.w;
      }
      dot = warp_sum(dot) * inv / static_cast<float>(d);  // mean(gw x̂)
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int j = (k * 32 + lane) * 4;
      if (j >= d) break;
      float4 g = gout ? load4(gout + base + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      if (gh) {
        const float4 g4 = load4(gh + base + j), o4 = load4(out + base + j), w4 = load4(w + j);
        auto norm_grad = [&](float ge, float oe, float we, float& acc, float& dwe) {
          const float xh = oe * inv;
          acc += inv * (ge * we - xh * dot);
          dwe += ge * xh;
        };
        norm_grad(g4.x, o4.x, w4.x, g.x, dw[k].x);
        norm_grad(g4.y, o4.y, w4.y, g.y, dw[k].y);
        norm_grad(g4.z, o4.z, w4.z, g.z, dw[k].z);
        norm_grad(g4.w, o4.w, w4.w, g.w, dw[k].w);
      }
      const float4 xv = load4(x + base + j), x0v = load4(x0 + base + j);
      float4 s = xv;
      if (y) {
        const float4 yv = load4(y + base + j);
        s = make_float4(__fadd_rn(xv.x, yv.x), __fadd_rn(xv.y, yv.y), __fadd_rn(xv.z, yv.z), __fadd_rn(xv.w, yv.w));
      }
      const float4 rg = make_float4(__fmul_rn(rv, g.x), __fmul_rn(rv, g.y), __fmul_rn(rv, g.z), __fmul_rn(rv, g.w));
      store4(gx + base + j, rg);
      if (y) store4(gy + base + j, rg);
      store4(gx0 + base + j,
             make_float4(__fmul_rn(bv, g.x), __fmul_rn(bv, g.y), __fmul_rn(bv, g.z), __fmul_rn(bv, g.w)));
      sr += g.x * s.x + g.y * s.y + g.z * s.z + g.w * s.w;
      sb += g.x * x0v.x + g.y * x0v.y + g.z * x0v.z + g.w * x0v.w;
    }
  }
  // The block's sums: warp by warp into shared memory, in a fixed order.
  extern __shared__ float block_sums[];  // [d + 2]
  for (int j = threadIdx.x; j < d + 2; j += blockDim.x) block_sums[j] = 0.f;
  sr = warp_sum(sr);
  sb = warp_sum(sb);
  __syncthreads();
  for (int wi = 0; wi < kNormWarps; ++wi) {
    if (warp == wi) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int j = (k * 32 + lane) * 4;
        if (j >= d) break;
        block_sums[j] += dw[k].x, block_sums[j + 1] += dw[k].y, block_sums[j + 2] += dw[k].z;
        block_sums[j + 3] += dw[k].w;
      }
      if (lane == 0) block_sums[d] += sr, block_sums[d + 1] += sb;
    }
    __syncthreads();
  }
  for (int j = threadIdx.x; j < d + 2; j += blockDim.x)
    partials[static_cast<int64_t>(blockIdx.x) * (d + 2) + j] = block_sums[j];
}

// Calls f with the fewest float4s per lane that hold a row of d elements (d <= kMaxMixNormWidth).
template <class F>
void with_row_vectors(int64_t d, F&& f) {
  if (d <= 512)
    f(std::integral_constant<int, 4>{});
  else if (d <= 1024)
    f(std::integral_constant<int, 8>{});
  else
    f(std::integral_constant<int, 16>{});
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

int64_t residual_mix_norm_backward_blocks(int64_t rows) {
  return std::max<int64_t>(1, std::min<int64_t>((rows + kNormWarps - 1) / kNormWarps, multiprocessors() * 4));
}

std::string residual_mix_norm_train(DecodeDtype dtype, const float* x, const void* y, const float* r, const float* x0,
                                    const float* b, const float* w, float eps, float* out, void* h, float* rstd,
                                    int64_t rows, int64_t d, void* stream) {
  if (rows == 0) return "";
  if (d % 4 != 0 || d > kMaxMixNormWidth) return "residual mix norm kernel: width " + std::to_string(d);
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((rows + kNormWarps - 1) / kNormWarps, multiprocessors() * 16));
  with_element_type(dtype, [&](auto tag) {
    using T = TagType<decltype(tag)>;
    with_row_vectors(d, [&](auto vec) {
      residual_mix_norm_kernel<T, decltype(vec)::value>
          <<<blocks, kNormWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
              x, static_cast<const T*>(y), r, x0, b, w, eps, out, static_cast<T*>(h), rstd, rows, static_cast<int>(d));
    });
  });
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("residual mix norm kernel: ") + cudaGetErrorString(e);
}

std::string residual_mix_norm_backward(DecodeDtype dtype, const float* gout, const void* gh, const float* out,
                                       const float* rstd, const float* w, const float* x, const void* y, const float* r,
                                       const float* x0, const float* b, float* gx, void* gy, float* gx0,
                                       float* partials, int64_t rows, int64_t d, void* stream) {
  if (rows == 0) return "";
  if (d % 4 != 0 || d > kMaxMixNormWidth) return "residual mix norm backward kernel: width " + std::to_string(d);
  const auto blocks = static_cast<unsigned>(residual_mix_norm_backward_blocks(rows));
  const size_t shared = static_cast<size_t>(d + 2) * sizeof(float);
  with_element_type(dtype, [&](auto tag) {
    using T = TagType<decltype(tag)>;
    with_row_vectors(d, [&](auto vec) {
      residual_mix_norm_backward_kernel<T, decltype(vec)::value>
          <<<blocks, kNormWarps * 32, shared, static_cast<cudaStream_t>(stream)>>>(
              gout, static_cast<const T*>(gh), out, rstd, w, x, static_cast<const T*>(y), r, x0, b, gx,
              static_cast<T*>(gy), gx0, partials, rows, static_cast<int>(d));
    });
  });
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("residual mix norm backward kernel: ") + cudaGetErrorString(e);
}

}  // namespace slm::ops::cuda
