// The mHC Sinkhorn projection in one kernel, one thread per n x n matrix held in registers: exp(z - max), then
// iters rounds of column and row normalisation, as model::sinkhorn computes with tensor ops.
//
// Each normalisation multiplies by one correctly rounded reciprocal of the sum instead of dividing every entry: the
// rounds are a serial chain in one thread, and IEEE division (a subroutine of ~20 dependent instructions) made the
// kernel 22 us per call on an H200, longer than the whole decode step of a small layer. The product differs from the
// quotient by at most one unit in the last place.
//
// Why: the tensor-op form launches about four kernels per round (sum, + eps, divide, for columns and again for
// rows); at the recipes' 20 rounds that is ~160 launches per mHC layer and decode token. In the 6B cmake
// specialist's NVFP4 decode step they were ~840 of 2,850 kernels (bench/RESULTS.md), each a few microseconds of GPU
// time for a 4 x 4 matrix.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/sinkhorn_kernel.h"

namespace slm::ops::cuda {

namespace {

template <int N>
__global__ void sinkhorn_kernel(const float* __restrict__ logits, float* __restrict__ out, int64_t matrices, int iters,
                                float eps) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= matrices) return;
  float m[N][N];
  const float* z = logits + i * N * N;
  float top = -INFINITY;
#pragma unroll
  for (int r = 0; r < N; ++r)
#pragma unroll
    for (int c = 0; c < N; ++c) {
      m[r][c] = z[r * N + c];
      top = fmaxf(top, m[r][c]);
    }
#pragma unroll
  for (int r = 0; r < N; ++r)
#pragma unroll
    for (int c = 0; c < N; ++c) m[r][c] = expf(m[r][c] - top);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < N; ++c) {
      float s = 0.0f;
#pragma unroll
      for (int r = 0; r < N; ++r) s += m[r][c];
      const float d = __frcp_rn(s + eps);
#pragma unroll
      for (int r = 0; r < N; ++r) m[r][c] *= d;
    }
#pragma unroll
    for (int r = 0; r < N; ++r) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < N; ++c) s += m[r][c];
      const float d = __frcp_rn(s + eps);
#pragma unroll
      for (int c = 0; c < N; ++c) m[r][c] *= d;
    }
  }
  float* o = out + i * N * N;
#pragma unroll
  for (int r = 0; r < N; ++r)
#pragma unroll
    for (int c = 0; c < N; ++c) o[r * N + c] = m[r][c];
}

template <int N>
std::string launch(const float* logits, float* out, int64_t matrices, int iters, float eps, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const auto blocks = static_cast<unsigned>((matrices + kThreads - 1) / kThreads);
  sinkhorn_kernel<N><<<blocks, kThreads, 0, stream>>>(logits, out, matrices, iters, eps);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("sinkhorn kernel: ") + cudaGetErrorString(e);
}

}  // namespace

std::string sinkhorn(const float* logits, float* out, int64_t matrices, int n, int iters, float eps, void* stream) {
  if (matrices == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  switch (n) {
    case 1: return launch<1>(logits, out, matrices, iters, eps, s);
    case 2: return launch<2>(logits, out, matrices, iters, eps, s);
    case 3: return launch<3>(logits, out, matrices, iters, eps, s);
    case 4: return launch<4>(logits, out, matrices, iters, eps, s);
    case 5: return launch<5>(logits, out, matrices, iters, eps, s);
    case 6: return launch<6>(logits, out, matrices, iters, eps, s);
    case 7: return launch<7>(logits, out, matrices, iters, eps, s);
    case 8: return launch<8>(logits, out, matrices, iters, eps, s);
    default:
      return "sinkhorn kernel: " + std::to_string(n) + " streams (1.." + std::to_string(kSinkhornMaxStreams) + ")";
  }
}

}  // namespace slm::ops::cuda
