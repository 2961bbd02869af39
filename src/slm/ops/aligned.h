#pragma once
// What the fused kernels' 16-byte loads need of a tensor: contiguous, its data 16-byte aligned.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slm::ops {

// x contiguous with its data 16-byte aligned: x itself when it is, else a copy (a fresh allocation is aligned).
inline at::Tensor contiguous_aligned16(const at::Tensor& x) {
  auto c = x.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0 ? c.clone() : c;
}

}  // namespace slm::ops
