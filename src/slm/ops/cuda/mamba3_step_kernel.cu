// One decode token of a SISO Mamba-3 layer, fused: from the layer's in_proj row to the new state and the
// pre-gate output, in one launch per layer instead of the ~100 small kernels of the libtorch step (mamba3_preprocess
// + mamba3_step: casts, the scalars, two RMSNorms, the rotation, three outer products). A decode step of
// hybrid-250m ran ~1,200 kernels, most of them elementwise (bench/RESULTS.md).
//
// CTAs per (row b, head h, block of kWarps state rows), 256 threads:
//   Δ = softplus(dd_dt + dt_bias), λ = σ(trap), a = -max(f(dd_a), a_floor)·Δ (f the heavy tail), γ = λΔ, ε = (1-λ)Δ,
//   α = e^a, β = εα;  φ_s = wrap(φ_s + Δ·π·tanh(angle_s)) into [0, 2π)
//   k = rot_φ(RMSNorm(B_g)·w_B + b_bias_h), q likewise from C (interleaved pairs (2s, 2s+1), s < S), g = h / (H/G)
//   S = α S + β x_prev k_prevᵀ + γ x kᵀ;  y = S q + D_h x;  the state keeps (φ, S, k, x).
// Warps take rows p of S, kRows at a time so that each lane has that many 16-byte loads in flight; lanes stride its
// N columns by float4 (coalesced), and a warp sum gives y_p. The P rows are spread over gridDim.z CTAs, which all
// recompute the head's scalars and key (N entries): with one CTA per head, hybrid-250m's 32 heads gave 32 CTAs on
// the H200's 132 SMs and each layer's step took ~20 us (bench/RESULTS.md). The launcher picks gridDim.z so that the
// batch's (row, head) pairs make about kTargetCtas CTAs: a batch-1 step gets several CTAs per head, and a batch of
// 64 one CTA per head that amortises that preamble over all P rows. The CTA of the first rows writes the state's
// phase, key and x. The state S may be updated in place (ssm_out == ssm_in): each entry is read and then written by
// the same thread.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/element.cuh"
#include "slm/ops/cuda/mamba3_step_kernel.h"

namespace slm::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 4;
// A wave of 256-thread CTAs on an H100/H200 (132 SMs x 8); more CTAs per head than that only repeat the preamble.
constexpr int64_t kTargetCtas = 1024;
constexpr float kPi = 3.14159265358979323846f;
constexpr float kTwoPi = 6.28318530717958647692f;

__device__ __forceinline__ float load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// Sum over the block; every thread gets it. scratch: kWarps floats.
__device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += scratch[w];
  return s;
}

template <class T>
__global__ void __launch_bounds__(kThreads) mamba3_step_kernel(Mamba3StepShape s, Mamba3StepArgs a) {
  extern __shared__ float smem[];
  const int h = blockIdx.x, b = blockIdx.y;
  const int N = static_cast<int>(s.d_state), P = static_cast<int>(s.headdim), S = static_cast<int>(s.angles);
  float* k = smem;             // [N] the new key
  float* q = k + N;            // [N] the query
  float* kp = q + N;           // [N] the previous key
  float* x = kp + N;           // [P]
  float* xp = x + P;           // [P]
  float* phase = xp + P;       // [S]
  float* scratch = phase + S;  // [kWarps]

  const T* row = static_cast<const T*>(a.proj) + b * s.width;
  const int64_t bc = s.groups * s.d_state;
  const int64_t scal = 2 * s.d_inner + 2 * bc;
  const int g = static_cast<int>(h / (s.heads / s.groups));
  const int64_t bh = static_cast<int64_t>(b) * s.heads + h;

  // The scalars (every thread, the same arithmetic).
  const float u_dt = load(row, scal + h) + load(static_cast<const T*>(a.dt_bias), h);
  const float dt = u_dt > 20.f ? u_dt : log1pf(expf(u_dt));
  const float lambda = 1.f / (1.f + expf(-load(row, scal + 2 * s.heads + h)));
  const float u_a = load(row, scal + s.heads + h);
  const float tail = fmaxf(u_a, 0.f) + 1.f / (1.f - fminf(u_a, 0.f));
  const float alpha = expf(-fmaxf(tail, s.a_floor) * dt);
  const float gamma = lambda * dt, beta = (1.f - lambda) * dt * alpha;

  const bool first = blockIdx.z == 0;
  for (int i = threadIdx.x; i < S; i += kThreads) {
    float ph = a.angle_in[bh * S + i] + dt * (kPi * tanhf(load(row, scal + 3 * s.heads + i)));
    ph -= kTwoPi * floorf(ph / kTwoPi);
    phase[i] = ph;
    if (first) a.angle_out[bh * S + i] = ph;
  }
  // B and C of the head's group, their mean squares for the RMSNorm.
  float sb = 0.f, sc = 0.f;
  for (int n = threadIdx.x; n < N; n += kThreads) {
    const float vb = load(row, 2 * s.d_inner + g * N + n), vc = load(row, 2 * s.d_inner + bc + g * N + n);
    k[n] = vb;
    q[n] = vc;
    sb += vb * vb;
    sc += vc * vc;
    kp[n] = a.k_in[bh * N + n];
  }
  for (int p = threadIdx.x; p < P; p += kThreads) {
    x[p] = load(row, s.d_inner + static_cast<int64_t>(h) * P + p);
    xp[p] = a.x_in[bh * P + p];
  }
  const float rb = rsqrtf(block_sum(sb, scratch) / N + s.norm_eps);
  const float rc = rsqrtf(block_sum(sc, scratch) / N + s.norm_eps);
  // Norm, gain and bias, then the rotation of the first 2S entries by pairs; each thread owns whole pairs.
  const T* wb = static_cast<const T*>(a.b_norm);
  const T* wc = static_cast<const T*>(a.c_norm);
  const T* bb = static_cast<const T*>(a.b_bias) + static_cast<int64_t>(h) * N;
  const T* cb = static_cast<const T*>(a.c_bias) + static_cast<int64_t>(h) * N;
  for (int j = threadIdx.x; j < (N + 1) / 2; j += kThreads) {
    const int n0 = 2 * j, n1 = 2 * j + 1;
    float k0 = k[n0] * rb * load(wb, n0) + load(bb, n0), q0 = q[n0] * rc * load(wc, n0) + load(cb, n0);
    if (n1 < N) {
      float k1 = k[n1] * rb * load(wb, n1) + load(bb, n1), q1 = q[n1] * rc * load(wc, n1) + load(cb, n1);
      if (j < S) {
        float sn, cs;
        sincosf(phase[j], &sn, &cs);
        const float rk0 = k0 * cs - k1 * sn, rk1 = k0 * sn + k1 * cs;
        const float rq0 = q0 * cs - q1 * sn, rq1 = q0 * sn + q1 * cs;
        k0 = rk0, k1 = rk1, q0 = rq0, q1 = rq1;
      }
      k[n1] = k1;
      q[n1] = q1;
    }
    k[n0] = k0;
    q[n0] = q0;
  }
  __syncthreads();
  if (first) {
    for (int n = threadIdx.x; n < N; n += kThreads) a.k_out[bh * N + n] = k[n];
    for (int p = threadIdx.x; p < P; p += kThreads) a.x_out[bh * P + p] = x[p];
  }
  // The state and the output: each warp takes kRows rows at a time, each lane float4 columns (N % 4 == 0).
  const float dh = load(static_cast<const T*>(a.d), h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n4 = N / 4;
  const auto* in = reinterpret_cast<const float4*>(a.ssm_in + bh * P * N);
  auto* out = reinterpret_cast<float4*>(a.ssm_out + bh * P * N);
  const auto* k4 = reinterpret_cast<const float4*>(k);
  const auto* kp4 = reinterpret_cast<const float4*>(kp);
  const auto* q4 = reinterpret_cast<const float4*>(q);
  const int stride = kWarps * static_cast<int>(gridDim.z);
  for (int p0 = static_cast<int>(blockIdx.z) * kWarps + warp; p0 < P; p0 += kRows * stride) {
    float dot[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) dot[r] = 0.f;
    for (int j = lane; j < n4; j += 32) {
      float4 v[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (p0 + r * stride < P) v[r] = in[(p0 + r * stride) * n4 + j];
      const float4 kk = k4[j], kpp = kp4[j], qq = q4[j];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int p = p0 + r * stride;
        if (p >= P) continue;
        const float bx = beta * xp[p], gx = gamma * x[p];
        float4 o;
        o.x = alpha * v[r].x + bx * kpp.x + gx * kk.x;
        o.y = alpha * v[r].y + bx * kpp.y + gx * kk.y;
        o.z = alpha * v[r].z + bx * kpp.z + gx * kk.z;
        o.w = alpha * v[r].w + bx * kpp.w + gx * kk.w;
        out[p * n4 + j] = o;
        dot[r] += o.x * qq.x + o.y * qq.y + o.z * qq.z + o.w * qq.w;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int p = p0 + r * stride;
      const float d = warp_sum(dot[r]);
      if (lane == 0 && p < P) a.y[bh * P + p] = d + dh * x[p];
    }
  }
}

}  // namespace

std::string mamba3_step(const Mamba3StepShape& s, bool bf16, const Mamba3StepArgs& a, void* stream) {
  if (s.d_state % 4) return "mamba3 step: d_state must be a multiple of 4";
  const size_t smem = sizeof(float) * (3 * s.d_state + 2 * s.headdim + s.angles + kWarps);
  const int64_t pairs = s.heads * s.batch, row_blocks = (s.headdim + kWarps - 1) / kWarps;
  const int64_t z = std::clamp<int64_t>((kTargetCtas + pairs - 1) / pairs, 1, row_blocks);
  const dim3 grid(static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch), static_cast<unsigned>(z));
  auto st = static_cast<cudaStream_t>(stream);
  if (bf16)
    mamba3_step_kernel<__nv_bfloat16><<<grid, kThreads, smem, st>>>(s, a);
  else
    mamba3_step_kernel<float><<<grid, kThreads, smem, st>>>(s, a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}

}  // namespace slm::ops::cuda
