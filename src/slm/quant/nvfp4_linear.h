#pragma once
// The quantized linear layer: y = x · W^T with W in NVFP4, dequantized on the fly inside the dot products.
//   CPU:  x float32/bfloat16/float16; rows of W split across threads (at::parallel_for). The kernel is picked at run
//         time: with AVX-512 BF16 x is rounded to BF16 (as on the GPU) and 32-element BF16 dot products accumulate in
//         FP32; else x stays FP32 in 16-wide FMA block products (AVX2, or portable C++).
//   CUDA: (built with SLM_CUDA=ON) BF16 activations, FP32 accumulation: the weight-only GEMV for up to 16 rows
//         (decode), else W decoded to BF16 and a cuBLAS GEMM (prefill, evaluation).
// Both compute in FP32 and return [..., N] for x [..., K] in `out` (FP32 by default). On CUDA a BF16 `out` is written
// by the GEMV itself, rounded as a cast of its FP32 result would be, so a decode step runs no cast kernel after it.
#include <torch/torch.h>

#include "slm/ops/gathered_linear.h"
#include "slm/quant/nvfp4.h"

namespace slm::nvfp4 {

// w: a 2-D QTensor [N, K] (use QTensor::matrix(i) for one expert of a stacked tensor), on x's device.
torch::Tensor linear(const torch::Tensor& x, const QTensor& w, torch::ScalarType out = torch::kFloat);

// Routed experts on the GPU: y[a] = x[a / x_div] · W[ids[a]]^T for every assignment a, W a stacked QTensor
// [E, N, K] on x's CUDA device, ids int64 [A] on that device, x [rows, K]; [A, N] in `out` (FP32 or BF16). One launch
// that reads the ids on the device (no host sync, so CUDA graphs can capture it). Throws slm::Error without CUDA.
torch::Tensor gathered_linear_cuda(const torch::Tensor& x, const QTensor& w, const torch::Tensor& ids, int64_t x_div,
                                   torch::ScalarType out = torch::kFloat);
// The same product with the assignments sorted by expert: order [A] int64 lists them expert by expert, ends [E] int32
// where each expert's run ends in order. Each expert's matrix is read once per 16 of its rows instead of once per
// assignment. y is still [A, N] in assignment order.
torch::Tensor grouped_linear_cuda(const torch::Tensor& x, const QTensor& w, const torch::Tensor& order,
                                  const torch::Tensor& ends, int64_t x_div, torch::ScalarType out = torch::kFloat);

// w's matrices as the fused MoE kernels take them (ops::Nvfp4Stack: its buffers, no copy); a 2-D w is one matrix.
ops::Nvfp4Stack as_stack(const QTensor& w);

// The kernels behind linear(), exposed for tests and benchmarks. x2: [M, K] on the kernel's device.
torch::Tensor linear_cpu(const torch::Tensor& x2, const QTensor& w);
// Throws slm::Error when the build has no CUDA kernels.
torch::Tensor linear_cuda(const torch::Tensor& x2, const QTensor& w, torch::ScalarType out = torch::kFloat);
bool cuda_kernels_built();
// The CPU kernels. Auto (the default) takes SLM_NVFP4_CPU_KERNEL's choice when that is set (portable, avx2,
// avx512-bf16), else the fastest this CPU runs; tests and benchmarks force one with set_cpu_kernel.
enum class CpuKernel { Auto, Portable, Avx2, Avx512Bf16 };
bool cpu_kernel_available(CpuKernel k);
void set_cpu_kernel(CpuKernel k);          // slm::Error when k does not run on this CPU
const char* cpu_kernel_name(CpuKernel k);  // Auto: the name of the kernel it picks

}  // namespace slm::nvfp4
