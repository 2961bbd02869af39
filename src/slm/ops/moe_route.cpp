#include "slm/ops/moe_route.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

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
  const std::string err = cuda::moe_route(logits.data_ptr<float>(), bias.data_ptr<float>(), experts.data_ptr<int64_t>(),
                                          weights.data_ptr<float>(), n, e, k, static_cast<float>(scaling_factor),
                                          c10::cuda::getCurrentCUDAStream(logits.device().index()).stream());
  if (!err.empty()) throw Error("moe_route_fused: " + err);
  return {experts, weights};
#else
  (void)scaling_factor;
  throw Error("moe_route_fused: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
