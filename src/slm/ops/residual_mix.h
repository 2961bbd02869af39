#pragma once
// The residual stream's per-layer mix, r * (x + y) + b * x0 with r and b 0-dim tensors (HybridLM's resid and x0
// lambdas) and y the previous layer's output (undefined: r * x + b * x0).
// Without a gradient, on CUDA, with everything in one dtype, one kernel (cuda/residual_mix_kernel.cu) that rounds as
// the tensor ops do and so equals them bit for bit. With a gradient, on CUDA, for training's FP32 stream (x, x0, r, b
// in FP32, contiguous; y in any of FP32/BF16/FP16), one kernel forward and one backward with the tensor ops' values
// and gradients (r's and b's summed in another order). Elsewhere those ops.
#include <ATen/core/Tensor.h>

#include <utility>

namespace slm::ops {

at::Tensor residual_mix(const at::Tensor& x, const at::Tensor& y, const at::Tensor& r, const at::Tensor& x0,
                        const at::Tensor& b);

// The mix followed by the next layer's pre-norm: {out, rms_norm(out, w, eps)}. For training on CUDA (an FP32 stream
// as residual_mix's fused form takes it, w FP32 [D] with D a multiple of 4 up to 2048, y absent or in the autocast
// dtype) one kernel forward and one backward, which write the normed output in the autocast dtype (FP32 without
// autocast) for the block's projections to read as it is, and give the norm's input gradient and the stream's
// gradient summed in the kernel (the tensor ops take the mix's kernels, the norm's, an FP32 -> BF16 cast of the
// normed output per projection, and a gradient accumulation). Elsewhere residual_mix, then ops::rms_norm.
std::pair<at::Tensor, at::Tensor> residual_mix_norm(const at::Tensor& x, const at::Tensor& y, const at::Tensor& r,
                                                    const at::Tensor& x0, const at::Tensor& b, const at::Tensor& w,
                                                    double eps);

// mHC's plain mix (model/features/mhc.h) and the next one's input together: for streams [..., n, D] and the block's
// output y [..., D], X' = streams + y on every stream and X'.mean(-2), which the next plain layer reads. Whether
// (with ops::fused_kernels_enabled()) stream_add_mean runs here: a CUDA build, both on the GPU in one dtype of FP32,
// BF16 or FP16, no gradient wanted, matching shapes.
bool stream_add_mean_fusable(const at::Tensor& streams, const at::Tensor& y);
// One kernel (a mean kernel over the strided stream dim and a broadcast add before): the sums round as the tensor
// ops round them, and the mean is their sum in FP32 times 1/n rounded once, as torch's mean computes it.
std::pair<at::Tensor, at::Tensor> stream_add_mean(const at::Tensor& streams, const at::Tensor& y);

}  // namespace slm::ops
