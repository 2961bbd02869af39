#pragma once
// Launchers of the MoE's training combine (src/slm/ops/cuda/moe_combine_kernel.cu); plain C++ so the .cu needs no
// torch. The computation is ops::moe_combine's (src/slm/ops/moe_combine.h).
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// The largest k (experts per token) the kernels take.
constexpr int kMoeCombineMaxK = 8;

// out[n, :] = Σ_j round(round(w[n, j]) ys[inv[n k + j], :]) for n < tokens, j < k, summed in FP32 and rounded once;
// round() is to dtype (FP32 or BF16), as the tensor ops (weights cast to the experts' dtype, the product, the sum over
// the k slots) round. ys [tokens k, d] and out [tokens, d] in dtype, w [tokens, k] FP32, inv [tokens k] int64; d a
// multiple of 16 bytes' elements. stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string moe_combine_forward(DecodeDtype dtype, const void* ys, const int64_t* inv, const float* w, void* out,
                                int64_t tokens, int k, int64_t d, void* stream);

// Its backward from g [tokens, d] (dtype): dys[inv[n k + j], :] = round(g[n, :] round(w[n, j])) (every row of dys is
// written once: inv is a permutation) and dw[n, j] = Σ_i g[n, i] ys[inv[n k + j], i] in FP32.
std::string moe_combine_backward(DecodeDtype dtype, const void* g, const void* ys, const int64_t* inv, const float* w,
                                 void* dys, float* dw, int64_t tokens, int k, int64_t d, void* stream);

}  // namespace slm::ops::cuda
