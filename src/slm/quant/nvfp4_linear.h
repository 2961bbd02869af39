#pragma once
// The quantized linear layer: y = x · W^T with W in NVFP4, dequantized on the fly inside the dot products.
//   CPU:  x float32/bfloat16/float16, computed in FP32; rows of W split across threads (at::parallel_for); the
//         inner loop is a 16-wide block product (AVX2 build of the kernel picked at run time when available).
//   CUDA: (built with SLM_CUDA=ON) BF16 activations, FP32 accumulation: the weight-only GEMV for up to 16 rows
//         (decode), else W decoded to BF16 and a cuBLAS GEMM (prefill, evaluation).
// Both return FP32 [..., N] for x [..., K] (the caller casts).
#include <torch/torch.h>

#include "slm/quant/nvfp4.h"

namespace slm::nvfp4 {

// w: a 2-D QTensor [N, K] (use QTensor::matrix(i) for one expert of a stacked tensor), on x's device.
torch::Tensor linear(const torch::Tensor& x, const QTensor& w);

// The kernels behind linear(), exposed for tests and benchmarks. x2: [M, K] on the kernel's device.
torch::Tensor linear_cpu(const torch::Tensor& x2, const QTensor& w);
// Throws slm::Error when the build has no CUDA kernels.
torch::Tensor linear_cuda(const torch::Tensor& x2, const QTensor& w);
bool cuda_kernels_built();
// Tests/benchmarks: false forces the portable CPU kernel even where the AVX2 one would run (default true).
void cpu_kernel_use_simd(bool on);

}  // namespace slm::nvfp4
