#pragma once
// Launchers of the fused M2RNN scan (src/slm/ops/cuda/m2rnn_scan_kernels.cu); plain C++ so that the .cu needs no
// torch. The recurrence, the clipping and the document resets are those of the libtorch reference in
// src/slm/ops/m2rnn_scan.cpp, which the CUDA tests compare against.
#include <cstdint>
#include <string>

namespace slm::ops::cuda {

struct M2rnnShape {
  int64_t batch, tokens, heads, k_dim, v_dim;
  int64_t every;  // tokens per checkpoint stretch
};

// Whether the kernels are compiled for this state shape: k_dim a multiple of 32 up to 1024 (one thread per state
// row), v_dim one of 4, 8, 16, 32 (a row lives in registers).
bool m2rnn_supported(int64_t k_dim, int64_t v_dim);

// Bytes of dynamic shared memory the backward needs; the caller keeps `every` small enough (at most 227 KiB).
int64_t m2rnn_backward_smem(const M2rnnShape& s);

// All tensors float32, contiguous, on one device:
//   q, k [B, T, Nh, K], v [B, T, Nh, V], f [B, T, Nh], keep [B, T] (1 = continue, 0 = document start) or null,
//   w [Nh, V, V], h0 [B, Nh, K, V].
// Forward writes y [B, T, Nh, V] (Hᵀq only; the D⊙v skip is the caller's), h_last [B, Nh, K, V] and, when
// checkpoints is not null, the state entering every stretch: [ceil(T / every), B, Nh, K, V].
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string m2rnn_forward(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                          const float* keep, const float* w, const float* h0, float* y, float* h_last,
                          float* checkpoints, void* stream);

// Backward of the forward above. dy [B, T, Nh, V] and dh_last [B, Nh, K, V] may be null (no gradient).
// grad_clip > 0 clamps each state's gradient as the reference does. scratch: [B, Nh, every + 1, K, V] floats.
// Writes dq, dk, dv, df, dh0 (same shapes as their inputs) and adds into dw [Nh, V, V], which must start at zero.
std::string m2rnn_backward(const M2rnnShape& s, const float* q, const float* k, const float* v, const float* f,
                           const float* keep, const float* w, const float* checkpoints, const float* dy,
                           const float* dh_last, float grad_clip, float* scratch, float* dq, float* dk, float* dv,
                           float* df, float* dw, float* dh0, void* stream);

}  // namespace slm::ops::cuda
