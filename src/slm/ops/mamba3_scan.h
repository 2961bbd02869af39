#pragma once
// Mamba-3 (exponential-trapezoidal SSM with data-dependent rotary state, SISO and MIMO rank R) as pure
// functions on tensors: preprocessing of the in_proj outputs, three implementations of the recurrence
// (sequential reference, chunked parallel form, single-token decode step) and the output gate.
// Notation (the Mamba-3 paper, arXiv 2603.15569): B batch, T tokens, H heads, P headdim, N d_state,
// G B/C groups (head h reads group h / (H/G)), R rank (1 for SISO), S rotary angles.
//
//   S_t = α_t S_{t-1} + β_t Σ_r v_{t-1,r} k̃_{t-1,r}ᵀ + γ_t Σ_r v_{t,r} k̃_{t,r}ᵀ      (S is P×N per head)
//   y_{t,r} = S_t q̃_{t,r} + D_h v_{t,r}
//   α = exp(a), a = AΔ;  γ = λΔ;  β = εα, ε = (1-λ)Δ;  v_{t,r} = x_t ⊙ mimo_x[h,r] (SISO: v = x).
//
// Rotary pairing, i < S, as the official kernels pair the N state coordinates: SISO interleaved (2i, 2i+1)
// (Triton), MIMO (mimo_x defined) half-split (i, i + N/2) (TileLang). The two differ by a fixed permutation of
// the B/C columns, so each layer kind matches its kernel's checkpoints only with its own pairing.
//
// All arithmetic runs in float64 when the inputs are float64 and in float32 otherwise (the decay sums,
// phases and state never drop below float32).
#include <ATen/core/Tensor.h>

#include <array>
#include <utility>

namespace slm::ops {

// The in_proj output of one layer, split: [z | x | B | C | dd_dt | dd_A | trap | angle].
struct Mamba3Projections {
  at::Tensor x;      // [B, T, H, P]
  at::Tensor b, c;   // [B, T, R, G, N]
  at::Tensor dd_dt;  // [B, T, H]
  at::Tensor dd_a;   // [B, T, H]
  at::Tensor trap;   // [B, T, H]
  at::Tensor angle;  // [B, T, S]
};

// The layer parameters preprocessing and the scans read.
struct Mamba3Weights {
  at::Tensor dt_bias;         // [H]
  at::Tensor b_bias, c_bias;  // [H, R, N]
  at::Tensor b_norm, c_norm;  // [N], RMSNorm gains shared by every group, rank and head
  at::Tensor mimo_x;          // [H, R, P]; undefined for SISO
  at::Tensor d;               // [H]
  double a_floor = 1e-4;
  double norm_eps = 1e-5;
};

// Per-token inputs of the recurrence: everything data-dependent is resolved here, so the three
// implementations below share one preprocessing and differ only in how they run the recurrence.
struct Mamba3Sequence {
  at::Tensor q, k;         // [B, T, H, R, N] normed, biased, rotated C and B (q̃, k̃)
  at::Tensor x;            // [B, T, H, P]
  at::Tensor a;            // [B, T, H] log decay AΔ (< 0)
  at::Tensor gamma;        // [B, T, H] λΔ
  at::Tensor eps;          // [B, T, H] (1-λ)Δ; β_t = ε_t α_t
  at::Tensor final_angle;  // [B, H, S] phase φ after the last token, in [0, 2π)
  at::Tensor mimo_x;       // [H, R, P]; undefined for SISO
  at::Tensor d;            // [H]
  at::Tensor start;        // [B, T] bool: a packed document starts here (the state resets); undefined: none
};

// What decoding carries from one token to the next. A zero state is the start of a sequence.
struct Mamba3State {
  at::Tensor angle;  // [B, H, S] phase φ_{t-1}
  at::Tensor ssm;    // [B, H, P, N] S_{t-1}
  at::Tensor k;      // [B, H, R, N] k̃_{t-1} (the pending β term's key)
  at::Tensor x;      // [B, H, P] raw x_{t-1} (mimo_x is applied when it is used)
  std::array<at::Tensor*, 4> tensors() { return {&angle, &ssm, &k, &x}; }
};

Mamba3State mamba3_zero_state(int64_t batch, int64_t heads, int64_t headdim, int64_t d_state, int64_t rank,
                              int64_t angles, const at::TensorOptions& options);

// A = -max(f(dd_A), A_floor) with the heavy-tail f(u) = 1+u (u >= 0), 1/(1-u) (u < 0);
// Δ = softplus(dd_dt + dt_bias); λ = σ(trap); k = RMSNorm_N(B)·w_B + B_bias (likewise q from C), then both
// rotated by φ_t = (φ_{t-1} + Δ_t π tanh(angle_t)) mod 2π, continuing from angle0 [B, H, S].
// start [B, T] (bool, optional) marks where packed documents begin: there the phase restarts from 0, ε is 0
// (no β term reaches back into the previous document) and the scans drop the state (α_t read as 0), so each
// document runs as if it started a sequence. Throws slm::Error on inconsistent shapes.
Mamba3Sequence mamba3_preprocess(const Mamba3Projections& p, const Mamba3Weights& w, const at::Tensor& angle0,
                                 const at::Tensor& start = {});

// The recurrence one token at a time (the reference). Returns y [B, T, H, R, P] (D term included) and the
// state after the last token.
std::pair<at::Tensor, Mamba3State> mamba3_scan_sequential(const Mamba3Sequence& s, const Mamba3State& state);

// The same function in chunks of chunk_size tokens with batched matmuls (training and prefill). T need not
// be a multiple of chunk_size.
std::pair<at::Tensor, Mamba3State> mamba3_scan_chunked(const Mamba3Sequence& s, const Mamba3State& state,
                                                       int64_t chunk_size);

// One decode step: s holds a single token (T == 1).
std::pair<at::Tensor, Mamba3State> mamba3_step(const Mamba3Sequence& s, const Mamba3State& state);

// Whether mamba3_scan_fused takes this layer: a CUDA build, CUDA inputs in FP32 or BF16, headdim 32 or 64, and SISO
// with d_state 32, 64 or 128 or MIMO rank 2 or 4 with d_state 64 or 128.
bool mamba3_fused(const Mamba3Projections& p, const Mamba3Weights& w);
// The same asked of a layer's sizes, for inputs in dtype on a CUDA device or not (what Mamba3Impl picks its backend
// from when weights load).
bool mamba3_fused_supported(bool cuda, at::ScalarType dtype, int64_t headdim, int64_t d_state, int64_t angles,
                            int64_t rank);

// Preprocessing and the chunked scan in one: the same function as mamba3_preprocess followed by mamba3_scan_chunked
// (y [B, T, H, R, P] in FP32, the state after the last token), with the keys built, rotated and scanned inside the
// fused CUDA kernels (ops/cuda/mamba3_scan_kernels.cu) and their own backward. Throws slm::Error where
// mamba3_fused is false or on inconsistent shapes.
std::pair<at::Tensor, Mamba3State> mamba3_scan_fused(const Mamba3Projections& p, const Mamba3Weights& w,
                                                     const Mamba3State& state, const at::Tensor& start = {});

// One decode token of a SISO layer in one CUDA kernel (ops/cuda/mamba3_step_kernel.cu) or one CPU loop
// (ops/mamba3_step_cpu.cpp), straight from the layer's in_proj output proj [B, width] laid out as Mamba3Impl splits
// it (z, x, B, C, dd_dt, dd_a, trap, angles): the same function as mamba3_preprocess + mamba3_step on that row
// (y [B, 1, H, 1, P] in FP32, before the gate; the next state in new tensors, except with ssm_in_place, where the
// next state's ssm is state.ssm updated in place: for a caller that keeps no earlier state, it saves a copy of the
// largest buffer). mamba3_step_fusable says whether it applies: SISO, proj and the weights in one dtype (FP32 on the
// CPU; FP32 or BF16 on the GPU of a CUDA build, with d_state a multiple of 4 and a 16-byte aligned state) on one
// device, an FP32 state, at most d_state / 2 angles.
struct Mamba3StepLayout {
  int64_t heads, headdim, groups, d_state, angles, d_inner;
};
bool mamba3_step_fusable(const at::Tensor& proj, const Mamba3Weights& w, const Mamba3State& state);
std::pair<at::Tensor, Mamba3State> mamba3_step_fused(const at::Tensor& proj, const Mamba3StepLayout& layout,
                                                     const Mamba3Weights& w, const Mamba3State& state,
                                                     bool ssm_in_place = false);

// Output gate and rank contraction: o_r = [RMSNorm_P(y_r)·w] ⊙ silu(z ⊙ mimo_z[h,r]), out = Σ_r o_r ⊙ mimo_o[h,r]
// (SISO: out = [norm](y) ⊙ silu(z)). y [B, T, H, R, P], z [B, T, H, P]; norm_weight [H·P] or undefined
// (is_outproj_norm off); mimo_z / mimo_o [H, R, P] or undefined (SISO). Returns [B, T, H·P].
at::Tensor mamba3_gate(const at::Tensor& y, const at::Tensor& z, const at::Tensor& mimo_z, const at::Tensor& mimo_o,
                       const at::Tensor& norm_weight, double norm_eps);

}  // namespace slm::ops
