#pragma once
// The training loss of the LM head: mean cross-entropy of logits [rows, vocab] against targets [rows], rows whose
// target is ignore_index left out (torch's cross_entropy with ignore_index and mean reduction).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slm::ops {

// On CUDA, for contiguous BF16 or FP32 logits, a fused kernel pair (ops/cuda/cross_entropy_kernels.cu) reads the
// logits in their own type and writes their gradient in it: no FP32 copy of the logits exists. Elsewhere the
// reference: at::cross_entropy on the logits in FP32 (FP64 stays FP64). Throws slm::Error on bad shapes.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index);

// Whether cross_entropy takes the fused kernels for these logits.
bool cross_entropy_fused(const at::Tensor& logits);

}  // namespace slm::ops
