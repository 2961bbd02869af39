#include "slm/ops/moe_route.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/moe_route_kernel.h"
#endif

namespace slm::ops {

bool moe_route_fusable(const at::Tensor& logits, int64_t k) {
#ifdef SLM_WITH_CUDA
  return fused_kernels_enabled() && logits.is_cuda() && logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
         !(at::GradMode::is_enabled() && logits.requires_grad()) && logits.size(1) >= 1 &&
         logits.size(1) <= cuda::kMoeRouteMaxExperts && k >= 1 && k <= logits.size(1) && k <= cuda::kMoeRouteMaxTopK;
#else
  (void)logits, (void)k;
  return false;
#endif
}

std::pair<at::Tensor, at::Tensor> moe_route_fused(const at::Tensor& logits_in, const at::Tensor& bias_in, int64_t k,
                                                  double scaling_factor) {
  if (!moe_route_fusable(logits_in, k))
    throw Error("moe_route_fused: no fused kernel for logits " + shape_text(logits_in) + " top-" + std::to_string(k) +
                " here (check moe_route_fusable)");
  const int64_t e = logits_in.size(1);
  if (bias_in.numel() != e || bias_in.device() != logits_in.device())
    throw Error("moe_route_fused: the bias must hold " + std::to_string(e) + " values on the logits' device");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(logits_in.device());
  const auto logits = logits_in.contiguous();
  const int64_t n = logits.size(0);
  const auto bias = bias_in.to(at::kFloat).contiguous();
  auto experts = at::empty({n, k}, logits.options().dtype(at::kLong));
  auto weights = at::empty({n, k}, logits.options());
  const std::string err =
      cuda::moe_route(logits.data_ptr<float>(), bias.data_ptr<float>(), experts.data_ptr<int64_t>(),
                      weights.data_ptr<float>(), n, e, k, static_cast<float>(scaling_factor), current_stream(logits));
  if (!err.empty()) throw Error("moe_route_fused: " + err);
  return {experts, weights};
#else
  (void)scaling_factor;
  throw Error("moe_route_fused: a CPU build has no fused kernel");
#endif
}

bool expert_order_fusable(const at::Tensor& experts, int64_t num_experts) {
#ifdef SLM_WITH_CUDA
  return fused_kernels_enabled() && experts.is_cuda() && experts.scalar_type() == at::kLong && experts.dim() == 2 &&
         experts.numel() >= 1 && experts.numel() <= cuda::kExpertOrderMaxAssignments && num_experts >= 1 &&
         num_experts <= cuda::kMoeRouteMaxExperts;
#else
  (void)experts, (void)num_experts;
  return false;
#endif
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> expert_order_fused(const at::Tensor& experts_in,
                                                                              int64_t num_experts) {
  if (!expert_order_fusable(experts_in, num_experts))
    throw Error("expert_order_fused: no fused kernel for experts " + shape_text(experts_in) + " over " +
                std::to_string(num_experts) + " experts here (check expert_order_fusable)");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(experts_in.device());
  const auto experts = experts_in.contiguous();
  const int64_t m = experts.numel();
  auto order = at::empty({m}, experts.options()), inv = at::empty({m}, experts.options()),
       token = at::empty({m}, experts.options());
  auto ends = at::empty({num_experts}, experts.options().dtype(at::kInt));
  const std::string err = cuda::expert_order(
      experts.data_ptr<int64_t>(), m, experts.size(1), num_experts, order.data_ptr<int64_t>(), inv.data_ptr<int64_t>(),
      token.data_ptr<int64_t>(), ends.data_ptr<int32_t>(), current_stream(experts));
  if (!err.empty()) throw Error("expert_order_fused: " + err);
  return {order, inv, token, ends};
#else
  throw Error("expert_order_fused: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
