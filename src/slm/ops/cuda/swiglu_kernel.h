#pragma once
// Launchers of the SwiGLU activation's kernels (src/slm/ops/cuda/swiglu_kernel.cu); plain C++ so the .cu needs no
// torch. The computation is ops::swiglu's (src/slm/ops/swiglu.h).
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// out[r, j] = silu(h[r, j]) * h[r, hidden + j] for h [rows, 2 * hidden] and out [rows, hidden], contiguous, one dtype;
// silu rounded to the dtype before the product. stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string swiglu_forward(DecodeDtype dtype, const void* h, void* out, int64_t rows, int64_t hidden, void* stream);
// dh [rows, 2 * hidden] from the upstream gradient g [rows, hidden]: d gate = g · up · silu'(gate),
// d up = g · silu(gate) (silu rounded as in the forward), each formed in FP32 and rounded once.
std::string swiglu_backward(DecodeDtype dtype, const void* g, const void* h, void* dh, int64_t rows, int64_t hidden,
                            void* stream);

// Mamba-3's output gate: out[r, c] = y[r, c] * silu(z[r, c]) for rows x cols, y FP32 and out in dtype contiguous,
// z in dtype with rows z_stride elements apart (a slice of the input projection); the product formed in FP32 and
// rounded once.
std::string silu_gate_forward(DecodeDtype dtype, const float* y, const void* z, void* out, int64_t rows, int64_t cols,
                              int64_t z_stride, void* stream);
// Its backward from g (dtype, contiguous): dy = g silu(z) (FP32), dz = g y silu'(z) (dtype, contiguous).
std::string silu_gate_backward(DecodeDtype dtype, const void* g, const float* y, const void* z, float* dy, void* dz,
                               int64_t rows, int64_t cols, int64_t z_stride, void* stream);

}  // namespace slm::ops::cuda
