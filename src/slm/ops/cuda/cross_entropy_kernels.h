#pragma once
// Launchers of the fused cross-entropy (src/slm/ops/cuda/cross_entropy_kernels.cu); plain C++ so that the .cu needs no
// torch. The loss is that of the reference in src/slm/ops/cross_entropy.cpp (log-softmax and the negative log
// likelihood of the target, rows with the ignored target left out), which the CUDA tests compare against.
#include <cstdint>
#include <string>

namespace slm::ops::cuda {

enum class LogitType { kFloat, kBFloat16 };

// logits [rows, vocab] contiguous, targets [rows] int64 (ignore_index or 0..vocab-1; any other value is an error the
// kernel reports as a NaN loss for that row). Writes per row lse [rows] = log Σ exp(x) and loss [rows] = lse - x[t]
// (0 for an ignored row), both float32. stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string cross_entropy_forward(LogitType type, const void* logits, const int64_t* targets, int64_t rows,
                                  int64_t vocab, int64_t ignore_index, float* lse, float* loss, void* stream);

// The gradient of (Σ_rows loss) * grad[0] / count[0] with respect to the logits, written in the logits' type:
// (softmax(x) - onehot(t)) * grad / count for a kept row, 0 for an ignored one. grad and count are float32 device
// scalars (the upstream gradient and the number of kept rows), read by the kernel so that nothing waits on the host.
std::string cross_entropy_backward(LogitType type, const void* logits, const int64_t* targets, const float* lse,
                                   const float* grad, const float* count, int64_t rows, int64_t vocab,
                                   int64_t ignore_index, void* dlogits, void* stream);

}  // namespace slm::ops::cuda
