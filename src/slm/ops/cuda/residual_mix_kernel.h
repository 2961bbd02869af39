#pragma once
// Launcher of the residual-stream mix (src/slm/ops/cuda/residual_mix_kernel.cu); plain C++ so the .cu needs no torch.
// The computation is ops::residual_mix's (src/slm/ops/residual_mix.h).
#include <cstdint>
#include <string>

#include "slm/ops/cuda/decode_attention_kernels.h"

namespace slm::ops::cuda {

// out[i] = r * (x[i] + y[i]) + b * x0[i] over n contiguous elements of one dtype (y null: r * x[i] + b * x0[i]); r and
// b point at one element each (device memory, the same dtype), so a replayed CUDA graph reads their current values.
// stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string residual_mix(DecodeDtype dtype, const void* x, const void* y, const void* r, const void* x0, const void* b,
                         void* out, int64_t n, void* stream);

// Training (an FP32 stream under BF16 autocast): the same mix with x, x0, r, b and out in FP32 and y in y_dtype (the
// block output's type) or null; the sum is formed in FP32 as the tensor ops promote it.
std::string residual_mix_train(DecodeDtype y_dtype, const float* x, const void* y, const float* r, const float* x0,
                               const float* b, float* out, int64_t n, void* stream);
// Its backward from the output gradient g: gx = r g, gy = r g in y_dtype (not written without y), gx0 = b g, and
// partials [residual_mix_backward_blocks(n)][2] whose column sums are r's gradient, sum g (x + y), and b's, sum g x0.
int64_t residual_mix_backward_blocks(int64_t n);
std::string residual_mix_backward(DecodeDtype y_dtype, const float* g, const float* x, const void* y, const float* r,
                                  const float* x0, const float* b, float* gx, void* gy, float* gx0, float* partials,
                                  int64_t n, void* stream);

// Training's mix and the next layer's pre-norm together, for rows of d elements (d a multiple of 4, at most
// kMaxMixNormWidth): out = the mix above (FP32, y in dtype or null), rstd[row] = 1 / sqrt(mean(out^2) + eps) and
// h = out * rstd * w rounded to dtype (w FP32 [d]).
constexpr int64_t kMaxMixNormWidth = 2048;
std::string residual_mix_norm_train(DecodeDtype dtype, const float* x, const void* y, const float* r, const float* x0,
                                    const float* b, const float* w, float eps, float* out, void* h, float* rstd,
                                    int64_t rows, int64_t d, void* stream);
// Its backward from gout (out's gradient, FP32, or null for none) and gh (h's, in dtype, or null): gx, gy (dtype, not
// written without y) and gx0 as residual_mix_backward forms them from gout plus the norm's input gradient, and
// partials [residual_mix_norm_backward_blocks(rows)][d + 2] whose column sums are w's gradient (d columns), then r's
// and b's.
int64_t residual_mix_norm_backward_blocks(int64_t rows);
std::string residual_mix_norm_backward(DecodeDtype dtype, const float* gout, const void* gh, const float* out,
                                       const float* rstd, const float* w, const float* x, const void* y, const float* r,
                                       const float* x0, const float* b, float* gx, void* gy, float* gx0,
                                       float* partials, int64_t rows, int64_t d, void* stream);
// out[r, i, j] = x[r, i, j] + y[r, j] for i < n (rounded to the dtype), mean[r, j] = (sum over i of out[r, i, j], in
// FP32) * (1/n in FP32), rounded; x, out [rows, n, d] and y, mean [rows, d] contiguous, one dtype.
std::string stream_add_mean(DecodeDtype dtype, const void* x, const void* y, void* out, void* mean, int64_t rows,
                            int64_t n, int64_t d, void* stream);

}  // namespace slm::ops::cuda
