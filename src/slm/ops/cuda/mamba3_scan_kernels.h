#pragma once
// Launchers of the fused Mamba-3 SISO chunked scan (src/slm/ops/cuda/mamba3_scan_kernels.cu); plain C++ so that the
// .cu needs no torch. The recurrence, its rotary keys and the document resets are those of the libtorch reference in
// src/slm/ops/mamba3_scan.cpp (mamba3_preprocess + mamba3_scan_sequential), which the CUDA tests compare against.
#include <cstdint>
#include <string>

namespace slm::ops::cuda {

struct Mamba3Shape {
  int64_t batch, tokens, heads, groups, headdim, d_state, angles;
};

// Whether the kernels are compiled for this head shape: headdim 32 or 64, d_state 32, 64 or 128, at most d_state / 2
// rotary angles.
bool mamba3_supported(int64_t headdim, int64_t d_state, int64_t angles);

// Everything per token that the scan reads, FP32, contiguous, on one device:
//   x [B, T, H, P] the values; bn, cn [B, T, G, N] B and C after their RMSNorm and gain (head h reads group
//   h / (H / G)); b_bias, c_bias [H, N]; dt [B, T, H] Δ and theta [B, T, S] π·tanh(angle), whose products are the
//   phase steps (φ_t = φ_{t-1} + Δ_t θ_t, from angle0 [B, H, S], restarting from 0 at a document start, kept in
//   [0, 2π)); the keys and queries are rotated by φ on interleaved pairs (2i, 2i+1), i < S, as the SISO reference
//   rotates; a [B, T, H] the log decay; gamma [B, T, H] the weight of the token's own outer product;
//   sigma [B, T, H] = γ_t + ε_{t+1} (0 past the last token); d [H] the skip; start [B, T] (1 = a packed document
//   starts here: the state entering the token is dropped) or null.
struct Mamba3ScanInputs {
  const float *x, *bn, *cn, *b_bias, *c_bias, *dt, *theta, *angle0, *a, *gamma, *sigma, *d;
  const uint8_t* start;
};

// Gradients the backward writes (same shapes as the inputs above): dx; dk_pre, dq_pre [B, T, H, N] the gradients
// of bn + b_bias and cn + c_bias per head before rotation (the caller sums heads into groups and tokens into the
// biases); da, dgamma, dsigma; dangle0 [B, H, S]; dh0 [B, H, P, N] the gradient of the initial state, or null.
// ddt, dtheta and dd [H] must start at zero: heads (dtheta, dd) and angles (ddt) meet there atomically.
struct Mamba3ScanGrads {
  float *dx, *dk_pre, *dq_pre, *da, *dgamma, *dsigma, *dangle0, *dh0;
  float *ddt, *dtheta, *dd;
};

// Tokens per chunk: the forward keeps the state and the phase entering every chunk for the backward.
int64_t mamba3_chunk();

// What the forward keeps for the backward: the state and the phase entering every chunk.
struct Mamba3Checkpoints {
  float* state;  // [B, H, ceil(T / chunk), P, N]
  float* phase;  // [B, H, ceil(T / chunk), S]
};

// Forward: y [B, T, H, P] (D·x included), h_last [B, H, P, N] the state after the last token, final_angle [B, H, S]
// the phase after it, and, when cps.state is not null, the checkpoints. h0 [B, H, P, N] or null (zero).
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string mamba3_forward(const Mamba3Shape& s, const Mamba3ScanInputs& in, const float* h0, float* y, float* h_last,
                           float* final_angle, const Mamba3Checkpoints& cps, void* stream);

// Backward of the forward above from its checkpoints. dy [B, T, H, P], dh_last [B, H, P, N] and dfinal_angle
// [B, H, S] may be null.
std::string mamba3_backward(const Mamba3Shape& s, const Mamba3ScanInputs& in, const Mamba3Checkpoints& cps,
                            const float* dy, const float* dh_last, const float* dfinal_angle, const Mamba3ScanGrads& g,
                            void* stream);

}  // namespace slm::ops::cuda
