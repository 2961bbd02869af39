#pragma once
// Launcher of the gathered matrix-vector products (src/slm/ops/cuda/gathered_linear_kernel.cu); plain C++ so the .cu
// needs no torch. The computation is ops::gathered_linear's (src/slm/ops/gathered_linear.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// y [assignments, out] = for each assignment a: w[ids[a]] [out, in] times x[a / x_div] [in]. w [experts, out, in],
// x [rows, in] and y contiguous, of one dtype, 16-byte aligned with in a multiple of 16 bytes; ids int64 on the
// device, or null: every assignment reads w[0] (a plain matrix-vector product). Accumulates in FP32; y is FP32 with
// float_out, else of the inputs' dtype. stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string gathered_linear(DecodeDtype dtype, const void* x, const void* w, const int64_t* ids, void* y,
                            bool float_out, int64_t assignments, int64_t x_div, int64_t out, int64_t in, void* stream);

// The dynamic shared memory the combine kernel may take (the default limit without an opt-in), and what it takes:
// the FP32 activations, then the slots' expert ids.
constexpr size_t kMaxCombineSharedBytes = 48 << 10;
constexpr size_t combine_shared_bytes(int64_t k, int64_t hidden, int64_t shared_hidden) {
  return sizeof(float) * static_cast<size_t>((k * hidden + shared_hidden + 1) / 2 * 2) +
         sizeof(int64_t) * static_cast<size_t>(k);
}

// y [tokens, out] = for each token t: sum over s < k of gates[t k + s] w[ids[t k + s]] act(h[t k + s]), plus
// w_shared act(h_shared[t]) when shared_hidden > 0; act(v) = silu(v[:H]) * v[H:] of a row of 2H. h [tokens k,
// 2 hidden], w [experts, out, hidden], h_shared [tokens, 2 shared_hidden], w_shared [out, shared_hidden] and y of one
// dtype, contiguous, 16-byte aligned with hidden and shared_hidden multiples of 16 bytes; gates FP32 [tokens, k]; ids
// int64 on the device. combine_shared_bytes must fit kMaxCombineSharedBytes. Accumulates in FP32.
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string gathered_swiglu_combine(DecodeDtype dtype, const void* h, const void* w, const int64_t* ids,
                                    const float* gates, const void* h_shared, const void* w_shared, void* y,
                                    int64_t tokens, int64_t k, int64_t out, int64_t hidden, int64_t shared_hidden,
                                    void* stream);

// A stack of NVFP4 matrices [matrices, out, in] as quant/nvfp4.h lays them out: codes [matrices · out, in / 2]
// (element 2i in the low nibble of byte i), E4M3 scales [matrices · out, in / 16], FP32 tensor_scale [matrices]; a
// weight is e2m1(code) · e4m3(scale of its 16) · tensor_scale of its matrix.
struct Nvfp4Matrices {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const float* tensor_scale = nullptr;
};

// gathered_swiglu_combine with NVFP4 down projections: w [experts, out, hidden] and w_shared [1, out, shared_hidden]
// (unused when shared_hidden is 0), hidden and shared_hidden multiples of 32, codes 16-byte and scales 2-byte aligned.
// h, h_shared and y as there.
std::string gathered_swiglu_combine_nvfp4(DecodeDtype dtype, const void* h, const Nvfp4Matrices& w, const int64_t* ids,
                                          const float* gates, const void* h_shared, const Nvfp4Matrices& w_shared,
                                          void* y, int64_t tokens, int64_t k, int64_t out, int64_t hidden,
                                          int64_t shared_hidden, void* stream);

}  // namespace slm::ops::cuda
