#pragma once
// Rows against matrices picked by id on the device, read in place (cuda/gathered_linear_kernel.cu): the decode
// step's routed experts in BF16/FP16/FP32, as nvfp4::gathered_linear_cuda is for NVFP4 experts.
//   x [rows, in]; w [experts, out, in] (nn.Linear's layout per expert); ids [A] int64 on the device, each < experts,
//   or undefined: A = rows * x_div assignments that all read w[0]; assignment a reads row a / x_div of x. Returns y [A,
//   out] in x's dtype (FP32 with float_out), y[a] = w[ids[a]] x[a / x_div], accumulated in FP32.
#include <ATen/core/Tensor.h>

namespace slm::ops {

// Whether (with ops::fused_kernels_enabled()) gathered_linear runs here: a CUDA build, x and w on the GPU in one of
// FP32/BF16/FP16, x [rows, *] and w contiguous with rows of whole 16-byte runs, no gradient wanted (the sizes are
// checked by gathered_linear).
bool gathered_linear_fusable(const at::Tensor& x, const at::Tensor& w);

at::Tensor gathered_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& ids, int64_t x_div,
                           bool float_out = false);

// x [..., in] times w [out, in] transposed, as at::linear without a bias, by the gathered kernel where
// gathered_linear_fusable allows and x is one row (a decode step of one sequence: on an H200 that kernel took
// hybrid-250m's dense projections from 0.36 to ~0.19 ms per step against cuBLAS's batch-1 kernels, bench/RESULTS.md;
// more rows are not measured and stay with at::linear).
constexpr int64_t kGemvMaxRows = 1;
at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w);
// The same in FP32 from x and w as they are: at::linear(x.float(), w.float()) up to the order of the sum, without the
// two casts (the MoE router's logits).
at::Tensor small_batch_linear_float(const at::Tensor& x, const at::Tensor& w);

// The down projection of a decode step's MoE and everything around it, in one kernel (cuda/gathered_linear_kernel.cu):
//   y[t] = sum over s < k of gates[t, s] w[ids[t k + s]] act(h[t k + s])  +  w_shared act(h_shared[t])
// with act(v) = silu(v[:H]) * v[H:] (SwiGLU), h [N k, 2H] (the gathered up projections), w [E, D, H], ids [N k] int64,
// gates [N, k]; h_shared [N, 2Hs] and w_shared [D, Hs] (a shared expert's) or both undefined. Returns y [N, D] in h's
// dtype, computed in FP32 from the inputs and rounded once (the tensor ops round act, each product and each gated
// term to the dtype). The _fusable check, before h exists (x: a tensor of h's dtype and device, such as the layer's
// input): gathered_linear_fusable's conditions for x and w, w_shared like them, and the k H + Hs activations within
// the kernel's shared memory.
bool gathered_swiglu_combine_fusable(const at::Tensor& x, const at::Tensor& w, int64_t k, const at::Tensor& w_shared);
at::Tensor gathered_swiglu_combine(const at::Tensor& h, const at::Tensor& w, const at::Tensor& ids,
                                   const at::Tensor& gates, const at::Tensor& h_shared, const at::Tensor& w_shared);

// The down projections in NVFP4, as quant/nvfp4.h stores a stack of matrices [matrices, out, in]: codes uint8
// [matrices · out, in / 2], E4M3 scales uint8 [matrices · out, in / 16], FP32 tensor_scale [matrices].
struct Nvfp4Stack {
  at::Tensor codes, scales, tensor_scale;
  int64_t matrices = 0, out = 0, in = 0;
};
// gathered_swiglu_combine with w (experts) and w_shared (one matrix, or matrices 0 for none) in NVFP4: whether it
// runs here for activations of x's dtype and device (the layer's input; h [tokens · k, 2 · w.in] comes from it): on
// the GPU in FP32/BF16/FP16 without a gradient, in a multiple of 32 for both matrices (whole 16-byte code chunks),
// the activations within the kernel's shared memory.
bool gathered_swiglu_combine_nvfp4_fusable(const at::Tensor& x, const Nvfp4Stack& w, int64_t k,
                                           const Nvfp4Stack& w_shared);
at::Tensor gathered_swiglu_combine_nvfp4(const at::Tensor& h, const Nvfp4Stack& w, const at::Tensor& ids,
                                         const at::Tensor& gates, const at::Tensor& h_shared,
                                         const Nvfp4Stack& w_shared);

}  // namespace slm::ops
