#pragma once
// M2RNN (matrix-state non-linear RNN, arXiv 2603.14360) as pure functions on tensors.
// Per batch row and head a K×V state:
//   H_t = f_t H_{t-1} + (1 - f_t) tanh(H_{t-1} W + k_t v_tᵀ),   y_t = H_tᵀ q_t + D ⊙ v_t
// The tanh rules out a parallel-in-time form, so the scan is sequential in t and batched over batch × heads.
#include <ATen/core/Tensor.h>

#include <utility>

namespace slm::ops {

// q, k [B, T, Nh, K] (already broadcast to the state heads), v [B, T, Nh, V], f [B, T, Nh] forget gate in
// (0, 1), w [Nh, V, V], d [Nh, V], h0 [B, Nh, K, V]. Returns y [B, T, Nh, V] and H after the last token.
//
// Training path: the forward keeps H only every checkpoint_every tokens; the backward recomputes the
// states of one stretch at a time and runs backpropagation through time over it, so memory grows with
// T/checkpoint_every states rather than T. grad_clip > 0 clamps the gradient reaching each H_t (its y_t
// and H_{t+1} paths together) to [-grad_clip, grad_clip] before it flows further back, as the reference
// does; the forward is unaffected. grad_clip <= 0 turns clipping off. reset [B, T] (bool, optional) marks where
// packed documents start: there the token starts from H = 0 instead of H_{t-1}. Throws slm::Error on bad shapes.
std::pair<at::Tensor, at::Tensor> m2rnn_scan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& f, const at::Tensor& w, const at::Tensor& d,
                                             const at::Tensor& h0, double grad_clip, int64_t checkpoint_every,
                                             const at::Tensor& reset = {});

// Whether m2rnn_scan runs these inputs through the fused CUDA kernels (ops/cuda/m2rnn_scan_kernels.cu): a CUDA
// build, CUDA inputs in FP32 or BF16 (FP64 stays on the reference) and a state shape the kernels are compiled for.
// Otherwise the scan is the libtorch loop above, the reference the kernels are tested against.
bool m2rnn_fused(const at::Tensor& q, const at::Tensor& v, const at::Tensor& w, int64_t checkpoint_every);

// One decode step: q, k [B, Nh, K], v [B, Nh, V], f [B, Nh]; returns y [B, Nh, V] and the new H.
std::pair<at::Tensor, at::Tensor> m2rnn_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& f, const at::Tensor& w, const at::Tensor& d,
                                             const at::Tensor& h);

}  // namespace slm::ops
