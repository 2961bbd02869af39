#pragma once
// MoE routing (model::route: sigmoid affinities, top-k of affinity + balancing bias, gates from the unbiased
// affinities normalized and scaled) in one CUDA kernel, cuda/moe_route_kernel.cu, for inference: no affinities are
// returned (only the auxiliary loss of training reads them).
#include <ATen/core/Tensor.h>

#include <utility>

namespace slm::ops {

// Whether (with ops::fused_kernels_enabled()) moe_route_fused runs here: a CUDA build, FP32 logits [N, E] on the GPU,
// no gradient wanted, E <= 1024 and k <= 32.
bool moe_route_fusable(const at::Tensor& logits, int64_t k);

// The selected experts [N, k] (int64, largest biased affinity first) and their gate weights [N, k] (FP32).
std::pair<at::Tensor, at::Tensor> moe_route_fused(const at::Tensor& logits, const at::Tensor& bias, int64_t k,
                                                  double scaling_factor);

}  // namespace slm::ops
