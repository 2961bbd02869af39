#pragma once
// Launchers of the fused Mamba-3 chunked scan (SISO and MIMO rank 2 or 4) (src/slm/ops/cuda/mamba3_scan_kernels.cu);
// plain C++ so that the .cu needs no torch. The recurrence, its rotary keys and the document resets are those of the
// libtorch reference in src/slm/ops/mamba3_scan.cpp (mamba3_preprocess + mamba3_scan_sequential), which the CUDA tests
// compare against.
#include <cstdint>
#include <string>

namespace slm::ops::cuda {

struct Mamba3Shape {
  int64_t batch, tokens, heads, groups, headdim, d_state, angles, rank;
};

// Whether the kernels are compiled for this head shape: headdim 32 or 64, at most d_state / 2 rotary angles, and
// SISO (rank 1) with d_state 32, 64 or 128 or MIMO rank 2 or 4 with d_state 64 or 128.
bool mamba3_supported(int64_t headdim, int64_t d_state, int64_t angles, int64_t rank);

// Everything per token that the scan reads, FP32, contiguous, on one device (R the rank, 1 for SISO):
//   x [B, T, H, P] the token's input; bn, cn [B, T, R, G, N] B and C after their RMSNorm and gain (head h reads
//   group h / (H / G)); b_bias, c_bias [H, R, N]; dt [B, T, H] Δ and theta [B, T, S] π·tanh(angle), whose products
//   are the phase steps (φ_t = φ_{t-1} + Δ_t θ_t, from angle0 [B, H, S], restarting from 0 at a document start, kept
//   in [0, 2π)); the keys and queries are rotated by φ on the reference's pairs, i < S: interleaved (2i, 2i+1) for
//   SISO, half-split (i, i + N/2) for MIMO; a [B, T, H] the log decay; gamma [B, T, H] the weight of the token's own
//   outer products; sigma [B, T, H] = γ_t + ε_{t+1} (0 past the last token); d [H] the skip; mimo_x [H, R, P] the
//   rank values' scales (v_{t,r} = x_t ⊙ mimo_x[h,r]), null for SISO (v = x); start [B, T] (1 = a packed document
//   starts here: the state entering the token is dropped) or null.
struct Mamba3ScanInputs {
  const float *x, *bn, *cn, *b_bias, *c_bias, *dt, *theta, *angle0, *a, *gamma, *sigma, *d, *mimo_x;
  const uint8_t* start;
};

// Gradients the backward writes (same shapes as the inputs above): dx; dk_pre, dq_pre [B, T, R, H, N] the gradients
// of bn + b_bias and cn + c_bias per head before rotation (the caller sums heads into groups and tokens into the
// biases); da, dgamma, dsigma; dangle0 [B, H, S]; dh0 [B, H, P, N] the gradient of the initial state, or null.
// ddt, dtheta, dd [H] and dmimo_x [H, R, P] (null for SISO) must start at zero: heads (dtheta, dd), angles (ddt) and
// batch rows (dd, dmimo_x) meet there atomically.
struct Mamba3ScanGrads {
  float *dx, *dk_pre, *dq_pre, *da, *dgamma, *dsigma, *dangle0, *dh0;
  float *ddt, *dtheta, *dd, *dmimo_x;
};

// Tokens per chunk at this rank (32 / rank: a chunk holds 32 (token, rank) rows): the forward keeps the state and the
// phase entering every chunk for the backward.
int64_t mamba3_chunk(int64_t rank);

// What the forward keeps for the backward: the state and the phase entering every chunk.
struct Mamba3Checkpoints {
  float* state;  // [B, H, ceil(T / chunk), P, N]
  float* phase;  // [B, H, ceil(T / chunk), S]
};

// Forward: y [B, T, H, R, P] (D·v included), h_last [B, H, P, N] the state after the last token, final_angle [B, H, S]
// the phase after it, and, when cps.state is not null, the checkpoints. h0 [B, H, P, N] or null (zero).
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string mamba3_forward(const Mamba3Shape& s, const Mamba3ScanInputs& in, const float* h0, float* y, float* h_last,
                           float* final_angle, const Mamba3Checkpoints& cps, void* stream);

// Backward of the forward above from its checkpoints. dy [B, T, H, R, P], dh_last [B, H, P, N] and dfinal_angle
// [B, H, S] may be null.
std::string mamba3_backward(const Mamba3Shape& s, const Mamba3ScanInputs& in, const Mamba3Checkpoints& cps,
                            const float* dy, const float* dh_last, const float* dfinal_angle, const Mamba3ScanGrads& g,
                            void* stream);

}  // namespace slm::ops::cuda
