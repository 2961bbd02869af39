#pragma once
// The MoE's combine for training: the expert outputs ys [N·k, D], in expert-sorted order, gated and summed back per
// token, out[n] = Σ_j w[n, j] · ys[inv[n·k + j]] (inv [N·k] int64: the row of each (token, slot) assignment; w [N, k]
// the gates). The values are those of the tensor ops model/layers/moe.cpp ran before (the rows gathered into a
// [N, k, D] copy, times the gates cast to the experts' dtype, summed over k in that dtype); the gate gradients are
// FP32 sums of exact products (the tensor ops round each product to the experts' dtype first).
#include <ATen/core/Tensor.h>

namespace slm::ops {

// Whether moe_combine runs the fused kernels (ops/cuda/moe_combine_kernel.cu): a CUDA build with
// ops::fused_kernels_enabled(), ys contiguous on the GPU in FP32 or BF16 with 16-byte rows, inv int64 and w FP32 on
// the same device, 1 <= k <= 8.
bool moe_combine_fusable(const at::Tensor& ys, const at::Tensor& inv, const at::Tensor& w);
// out [N, D] in ys' dtype, differentiable in ys and w. Throws slm::Error where moe_combine_fusable is false.
at::Tensor moe_combine(const at::Tensor& ys, const at::Tensor& inv, const at::Tensor& w);

}  // namespace slm::ops
