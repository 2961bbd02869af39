#pragma once
// Launcher of the DSA decode selection kernel (src/slm/ops/cuda/dsa_select_kernel.cu); plain C++ so the .cu needs no
// torch. The computation is ops::dsa_keep_step's (src/slm/ops/dsa_select.h).
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// scores [batch, keys] of dtype (contiguous), positions [batch] int64, keep [batch, keys] bytes (written whole).
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string dsa_keep_step(DecodeDtype dtype, const void* scores, const int64_t* positions, int64_t batch, int64_t keys,
                          double ratio, int64_t local_window, int64_t window, uint8_t* keep, void* stream);

}  // namespace slm::ops::cuda
