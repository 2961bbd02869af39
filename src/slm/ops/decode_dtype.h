#pragma once
// The element types of the fused decode kernels (cuda::DecodeDtype, which the torch-free .cu files share), from an
// at::ScalarType: one mapping for every ops wrapper.
#include <c10/core/ScalarType.h>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops {

inline bool decode_dtype_supported(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

// t must be decode_dtype_supported.
inline cuda::DecodeDtype decode_dtype(at::ScalarType t) {
  return t == at::kFloat ? cuda::DecodeDtype::kFloat
                         : (t == at::kBFloat16 ? cuda::DecodeDtype::kBFloat16 : cuda::DecodeDtype::kHalf);
}

}  // namespace slm::ops
