#pragma once
// MoE routing (model::route: sigmoid affinities, top-k of affinity + balancing bias, gates from the unbiased
// affinities normalized and scaled) in one CUDA kernel, cuda/moe_route_kernel.cu, for inference: no affinities are
// returned (only the auxiliary loss of training reads them).
#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>

namespace slm::ops {

// Whether (with ops::fused_kernels_enabled()) moe_route_fused runs here: a CUDA build, FP32 logits [N, E] on the GPU,
// no gradient wanted, E <= 1024 and k <= 32.
bool moe_route_fusable(const at::Tensor& logits, int64_t k);

// The selected experts [N, k] (int64, largest biased affinity first) and their gate weights [N, k] (FP32).
std::pair<at::Tensor, at::Tensor> moe_route_fused(const at::Tensor& logits, const at::Tensor& bias, int64_t k,
                                                  double scaling_factor);

// The order of a step's assignments by expert (what the grouped experts run in), in one CUDA kernel: whether (with
// ops::fused_kernels_enabled()) expert_order_fused runs here: a CUDA build, experts [N, k] int64 on the GPU, at most
// 2048 assignments and 1024 experts.
bool expert_order_fusable(const at::Tensor& experts, int64_t num_experts);

// For experts [N, k] (each id in [0, num_experts)): the permutation that sorts the N·k assignments by expert, stably
// (int64), its inverse (int64), each sorted assignment's token (order / k, int64) and the running count per expert
// (int32 [num_experts]) -- what torch::sort(stable) + searchsorted give, in one launch.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> expert_order_fused(const at::Tensor& experts,
                                                                              int64_t num_experts);

}  // namespace slm::ops
