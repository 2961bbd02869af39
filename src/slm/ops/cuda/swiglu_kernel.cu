// The SwiGLU activation, forward and backward, one elementwise kernel each: every thread takes 16 bytes of a row's
// gate half and the matching 16 bytes of its up half (one vector load each), so the kernels run at copy bandwidth.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/swiglu_kernel.h"

namespace slm::ops::cuda {

namespace {

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// silu in FP32 as at::silu computes it (x / (1 + exp(-x)), no fast-math exp), so that rounding it gives its value.
__device__ __forceinline__ float silu(float x) {
  return x / (1.0f + expf(-x));
}

// V: elements per thread (16 bytes, or 1 where the hidden width is not a multiple of that).
template <class T, int V>
__global__ void swiglu_forward_kernel(const T* __restrict__ h, T* __restrict__ out, int64_t rows, int64_t hidden) {
  const int64_t groups_per_row = hidden / V, groups = rows * groups_per_row;
  const T* tag = nullptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / groups_per_row, col = (i % groups_per_row) * V;
    const T* gate_at = h + row * 2 * hidden + col;
    const auto gate = *reinterpret_cast<const Pack<T, V>*>(gate_at);
    const auto up = *reinterpret_cast<const Pack<T, V>*>(gate_at + hidden);
    Pack<T, V> o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float s = round_to(silu(load(&gate.v[e])), tag);
      store(&o.v[e], __fmul_rn(s, load(&up.v[e])));
    }
    *reinterpret_cast<Pack<T, V>*>(out + row * hidden + col) = o;
  }
}

template <class T, int V>
__global__ void swiglu_backward_kernel(const T* __restrict__ g, const T* __restrict__ h, T* __restrict__ dh,
                                       int64_t rows, int64_t hidden) {
  const int64_t groups_per_row = hidden / V, groups = rows * groups_per_row;
  const T* tag = nullptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / groups_per_row, col = (i % groups_per_row) * V;
    const int64_t gate_at = row * 2 * hidden + col;
    const auto gate = *reinterpret_cast<const Pack<T, V>*>(h + gate_at);
    const auto up = *reinterpret_cast<const Pack<T, V>*>(h + gate_at + hidden);
    const auto gv = *reinterpret_cast<const Pack<T, V>*>(g + row * hidden + col);
    Pack<T, V> dgate, dup;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float x = load(&gate.v[e]), u = load(&up.v[e]), d = load(&gv.v[e]);
      const float sig = 1.0f / (1.0f + expf(-x));
      // silu'(x) = sig (1 + x (1 - sig)); the product's other factor is the silu the forward rounded.
      store(&dgate.v[e], d * u * sig * (1.0f + x * (1.0f - sig)));
      store(&dup.v[e], d * round_to(x * sig, tag));
    }
    *reinterpret_cast<Pack<T, V>*>(dh + gate_at) = dgate;
    *reinterpret_cast<Pack<T, V>*>(dh + gate_at + hidden) = dup;
  }
}

// Mamba-3's gate y * silu(z): y FP32 (the scan's output), z and the result in T; one element per thread.
template <class T>
__global__ void silu_gate_forward_kernel(const float* __restrict__ y, const T* __restrict__ z, T* __restrict__ out,
                                         int64_t rows, int64_t cols, int64_t z_stride) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(out + i, __fmul_rn(y[i], silu(load(z + (i / cols) * z_stride + i % cols))));
}

template <class T>
__global__ void silu_gate_backward_kernel(const T* __restrict__ g, const float* __restrict__ y, const T* __restrict__ z,
                                          float* __restrict__ dy, T* __restrict__ dz, int64_t rows, int64_t cols,
                                          int64_t z_stride) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = load(z + (i / cols) * z_stride + i % cols), d = load(g + i);
    const float sig = 1.0f / (1.0f + expf(-x));
    dy[i] = d * (x * sig);
    store(dz + i, d * y[i] * sig * (1.0f + x * (1.0f - sig)));
  }
}

constexpr int kThreads = 256;

unsigned grid(int64_t groups) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((groups + kThreads - 1) / kThreads, multiprocessors() * 16)));
}

std::string launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

// Calls f with the widest vector (16 bytes) that divides the hidden width where every pointer is 16-byte aligned,
// else single elements.
template <class T, class F>
void with_width(int64_t hidden, std::initializer_list<const void*> pointers, F&& f) {
  constexpr int kWide = 16 / sizeof(T);
  bool aligned = hidden % kWide == 0;
  for (const void* p : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  if (aligned)
    f(std::integral_constant<int, kWide>{});
  else
    f(std::integral_constant<int, 1>{});
}

}  // namespace

std::string swiglu_forward(DecodeDtype dtype, const void* h, void* out, int64_t rows, int64_t hidden, void* stream) {
  if (rows * hidden == 0) return "";
  with_element_type(dtype, [&](auto tag) {
    using T = TagType<decltype(tag)>;
    with_width<T>(hidden, {h, out}, [&](auto width) {
      constexpr int V = decltype(width)::value;
      swiglu_forward_kernel<T, V><<<grid(rows * hidden / V), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(h), static_cast<T*>(out), rows, hidden);
    });
  });
  return launched("swiglu forward kernel");
}

std::string swiglu_backward(DecodeDtype dtype, const void* g, const void* h, void* dh, int64_t rows, int64_t hidden,
                            void* stream) {
  if (rows * hidden == 0) return "";
  with_element_type(dtype, [&](auto tag) {
    using T = TagType<decltype(tag)>;
    with_width<T>(hidden, {g, h, dh}, [&](auto width) {
      constexpr int V = decltype(width)::value;
      swiglu_backward_kernel<T, V><<<grid(rows * hidden / V), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(g), static_cast<const T*>(h), static_cast<T*>(dh), rows, hidden);
    });
  });
  return launched("swiglu backward kernel");
}

std::string silu_gate_forward(DecodeDtype dtype, const float* y, const void* z, void* out, int64_t rows, int64_t cols,
                              int64_t z_stride, void* stream) {
  const int64_t n = rows * cols;
  if (n == 0) return "";
  with_element_type(dtype, [&](auto tag) {
    using T = TagType<decltype(tag)>;
    silu_gate_forward_kernel<T><<<grid(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        y, static_cast<const T*>(z), static_cast<T*>(out), rows, cols, z_stride);
  });
  return launched("silu gate forward kernel");
}

std::string silu_gate_backward(DecodeDtype dtype, const void* g, const float* y, const void* z, float* dy, void* dz,
                               int64_t rows, int64_t cols, int64_t z_stride, void* stream) {
  const int64_t n = rows * cols;
  if (n == 0) return "";
  with_element_type(dtype, [&](auto tag) {
    using T = TagType<decltype(tag)>;
    silu_gate_backward_kernel<T><<<grid(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(g), y, static_cast<const T*>(z), dy, static_cast<T*>(dz), rows, cols, z_stride);
  });
  return launched("silu gate backward kernel");
}

}  // namespace slm::ops::cuda
