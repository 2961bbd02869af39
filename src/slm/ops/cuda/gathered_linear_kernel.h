#pragma once
// Launcher of the gathered matrix-vector products (src/slm/ops/cuda/gathered_linear_kernel.cu); plain C++ so the .cu
// needs no torch. The computation is ops::gathered_linear's (src/slm/ops/gathered_linear.h).
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// y [assignments, out] = for each assignment a: w[ids[a]] [out, in] times x[a / x_div] [in]. w [experts, out, in],
// x [rows, in] and y contiguous, of one dtype, 16-byte aligned with in a multiple of 16 bytes; ids int64 on the
// device, or null: every assignment reads w[0] (a plain matrix-vector product). Accumulates in FP32. stream: a
// cudaStream_t. Returns "" or the CUDA error text.
std::string gathered_linear(DecodeDtype dtype, const void* x, const void* w, const int64_t* ids, void* y,
                            int64_t assignments, int64_t x_div, int64_t out, int64_t in, void* stream);

}  // namespace slm::ops::cuda
