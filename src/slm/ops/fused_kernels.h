#pragma once
// A process-wide switch for the inference-only fused CUDA kernels that replace short chains of tensor ops with
// equal results (rotary_norm.h, moe_route.h, residual_mix.h): on by default. Off, those ops run as tensor ops, so
// that a benchmark measures both forms in one run and a test compares a whole model's step with and without them.
#include <ATen/core/Tensor.h>

#include <string>

namespace slm::ops {

bool fused_kernels_enabled();
void set_fused_kernels(bool enabled);

// The kernel launchers (ops/cuda/*.h) return "" or an error text: this throws slm::Error with the text.
void check_launch(const std::string& error);

// The current CUDA stream of t's device, as the kernel launchers take it (a cudaStream_t); CUDA builds only.
void* current_stream(const at::Tensor& t);

}  // namespace slm::ops
