// Matrix-vector products with a matrix picked per row by an id on the device: the routed experts of a decode step,
// each (token, slot) assignment against its own expert's weights, read in place.
//
// Why: the tensor-op form (index_select of the selected experts' matrices, then bmm) copies every selected matrix
// before reading it again: on hybrid-250m in BF16 that copy was the largest single kernel family of a graphed decode
// step, 0.17 of 1.49 ms on an H200 (bench/RESULTS.md). One warp per output row streams the row in 16-byte loads.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/gathered_linear_kernel.h"

namespace slm::ops::cuda {

namespace {

constexpr int kWarps = 8;  // output rows per CTA

template <class T>
__global__ void gathered_linear_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                       const int64_t* __restrict__ ids, T* __restrict__ y, int64_t x_div, int64_t out,
                                       int64_t in) {
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte load
  const int64_t a = blockIdx.y;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= out) return;
  const int lane = threadIdx.x % 32;
  const T* wr = w + ((ids ? ids[a] : 0) * out + row) * in;
  const T* xr = x + (a / x_div) * in;
  float acc = 0.0f;
#pragma unroll 4
  for (int64_t j = static_cast<int64_t>(lane) * kVec; j < in; j += 32 * kVec) {
    const uint4 wv = *reinterpret_cast<const uint4*>(wr + j);
    const uint4 xv = *reinterpret_cast<const uint4*>(xr + j);
    const T* we = reinterpret_cast<const T*>(&wv);
    const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc += load(we + e) * load(xe + e);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) store(y + a * out + row, acc);
}

template <class T>
std::string launch(const void* x, const void* w, const int64_t* ids, void* y, int64_t assignments, int64_t x_div,
                   int64_t out, int64_t in, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((out + kWarps - 1) / kWarps), static_cast<unsigned>(assignments));
  gathered_linear_kernel<T><<<grid, kWarps * 32, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w), ids,
                                                              static_cast<T*>(y), x_div, out, in);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("gathered linear kernel: ") + cudaGetErrorString(e);
}

}  // namespace

std::string gathered_linear(DecodeDtype dtype, const void* x, const void* w, const int64_t* ids, void* y,
                            int64_t assignments, int64_t x_div, int64_t out, int64_t in, void* stream) {
  if (assignments == 0 || out == 0) return "";
  if (assignments > 65535 || x_div < 1) return "gathered linear kernel: bad assignment count or divisor";
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DecodeDtype::kFloat: return launch<float>(x, w, ids, y, assignments, x_div, out, in, s);
    case DecodeDtype::kBFloat16: return launch<__nv_bfloat16>(x, w, ids, y, assignments, x_div, out, in, s);
    case DecodeDtype::kHalf: return launch<__half>(x, w, ids, y, assignments, x_div, out, in, s);
  }
  return "gathered linear kernel: unknown dtype";
}

}  // namespace slm::ops::cuda
