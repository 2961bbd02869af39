#pragma once
// Launcher of the CUDA NVFP4 GEMV (src/slm/quant/cuda/nvfp4_gemv.cu); plain C++ so that the .cu needs no torch.
#include <cstdint>
#include <string>

namespace slm::nvfp4::cuda {

// y[m, n] = tensor_scale[0] * sum_k e2m1(code[n, k]) * e4m3(scale[n, k/16]) * x[m, k]  for m < M, n < N.
//   codes  [N, row_bytes] device, row_bytes = blocks * 8, 8-byte aligned
//   scales [N, blocks] device; tensor_scale: one float on the device
//   x      [M, blocks * 16] BF16 device, rows zero-padded, 16-byte aligned
//   y      [M, N] device: float, or BF16 when bf16_out (the FP32 sum rounded to nearest even)
// stream: a cudaStream_t (nullptr = the legacy default stream). Returns "" or the CUDA error text.
// pdl: programmatic dependent launch. The kernel may start while the previous kernel on the stream still runs and
// streams the weights (codes, scales) before that kernel has finished; x, tensor_scale and y are touched only after
// it. Only for weights that no kernel just before writes, such as a model's weights after loading. Consecutive
// GEMVs then overlap one's tail with the next one's weight loads.
std::string gemv(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x, void* y,
                 int64_t M, int64_t N, int64_t blocks, void* stream, bool pdl, bool bf16_out = false);

// Routed experts: for each assignment a < assignments, y[a, :] = W[ids[a]] x[a / x_div, :], where W is a stack of
// `experts` matrices [N, K] laid out as in gemv (codes [experts * N, row_bytes], scales [experts * N, blocks],
// tensor_scale [experts]) and ids int64 on the device (read by the kernel: the host never sees them). x rows as in
// gemv, y [assignments, N] as in gemv. One launch; no programmatic dependent launch.
std::string gemv_gathered(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x,
                          void* y, const int64_t* ids, int64_t assignments, int64_t x_div, int64_t experts, int64_t N,
                          int64_t blocks, void* stream, bool bf16_out = false);

// The same with the assignments sorted by expert: order [assignments] lists them expert by expert, ends [experts]
// (int32) where each expert's run ends in order. Each expert's matrix is read once for up to 16 of its rows, where
// gemv_gathered reads it once per assignment: for decode batches whose assignments share experts.
std::string gemv_grouped(const uint8_t* codes, const uint8_t* scales, const float* tensor_scale, const void* x, void* y,
                         const int64_t* order, const int32_t* ends, int64_t assignments, int64_t x_div, int64_t experts,
                         int64_t N, int64_t blocks, void* stream, bool bf16_out = false);

}  // namespace slm::nvfp4::cuda
