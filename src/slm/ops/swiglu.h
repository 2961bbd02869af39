#pragma once
// The SwiGLU activation of a fused gate/up projection: h [..., 2H] -> silu(h[..., :H]) * h[..., H:] ([..., H]), as the
// MLP, the shared expert and the routed experts apply it to their w13 output (model/modules.h).
// As tensor ops that is a chunk, silu and a product forward (two kernels) and a product's and silu's backward plus
// the chunk's concatenation (four kernels, three [rows, H] temporaries): about 33 ms of a 318 ms training step of the
// attention + MLP stack at batch 64 x 1024 on an H200 (bench/RESULTS.md). On CUDA (ops::fused_kernels_enabled(),
// h contiguous in FP32, BF16 or FP16) it is one kernel forward and one backward (cuda/swiglu_kernel.cu); elsewhere
// the tensor ops.
// The forward rounds silu to h's dtype before the product, as the tensor ops do, so the values are theirs bit for
// bit. The backward computes each gradient in FP32 from h and the upstream gradient and rounds once (the tensor ops
// round the product g·up before silu's derivative), so it is at least as accurate.
#include <ATen/core/Tensor.h>

namespace slm::ops {

at::Tensor swiglu(const at::Tensor& h);

// Mamba-3's output gate without MIMO or output norm: y [B, T, H, 1, P] (the scan's output) times silu(z), z [B, T, H,
// P] (a slice of the input projection, rows of P * H elements at a common stride), flattened to [B, T, H * P] in z's
// dtype. silu_gate_fusable: a CUDA build with ops::fused_kernels_enabled(), y FP32 contiguous on z's device, z in
// FP32/BF16/FP16 with contiguous rows. There, one kernel each way with the tensor ops' values (the product in FP32
// rounded once to z's dtype); silu_gate throws elsewhere.
bool silu_gate_fusable(const at::Tensor& y, const at::Tensor& z);
at::Tensor silu_gate(const at::Tensor& y, const at::Tensor& z);

}  // namespace slm::ops
