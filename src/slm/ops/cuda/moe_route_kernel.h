#pragma once
// Launcher of the fused MoE routing (src/slm/ops/cuda/moe_route_kernel.cu); plain C++ so the .cu needs no torch. The
// computation is model::route's (src/slm/model/layers/moe.h), which the CUDA test compares against.
#include <cstdint>
#include <string>

namespace slm::ops::cuda {

constexpr int64_t kMoeRouteMaxExperts = 1024;
constexpr int64_t kMoeRouteMaxTopK = 32;
constexpr int64_t kExpertOrderMaxAssignments = 2048;

// logits [tokens, experts] FP32 contiguous; bias [experts] FP32; experts_out [tokens, k] int64 and weights_out
// [tokens, k] FP32: the k largest sigmoid(logit) + bias per token, largest first, and their unbiased sigmoids
// normalized to sum to one times scaling. stream: a cudaStream_t. Returns "" or the CUDA error text.
std::string moe_route(const float* logits, const float* bias, int64_t* experts_out, float* weights_out, int64_t tokens,
                      int64_t experts, int64_t k, float scaling, void* stream);

// The assignments of experts [assignments] (int64, each in [0, num_experts), num_experts <= kMoeRouteMaxExperts,
// assignments <= kExpertOrderMaxAssignments) in a stable order by expert, in one CTA: order [assignments] (int64, the
// stable sort's permutation), inv [assignments] (int64, its inverse), token [assignments] (int64, order / k) and ends
// [num_experts] (int32, the inclusive running count per expert). stream: a cudaStream_t. Returns "" or the CUDA
// error text.
std::string expert_order(const int64_t* experts, int64_t assignments, int64_t k, int64_t num_experts, int64_t* order,
                         int64_t* inv, int64_t* token, int32_t* ends, void* stream);

}  // namespace slm::ops::cuda
