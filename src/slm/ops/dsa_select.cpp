#include "slm/ops/dsa_select.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/dsa_select_kernel.h"
#endif

namespace slm::ops {

bool dsa_keep_fusable(const at::Tensor& scores, int64_t local_window) {
#ifdef SLM_WITH_CUDA
  return fused_kernels_enabled() && scores.is_cuda() && scores.dim() == 2 &&
         decode_dtype_supported(scores.scalar_type()) && !(at::GradMode::is_enabled() && scores.requires_grad()) &&
         local_window >= 1;
#else
  (void)scores, (void)local_window;
  return false;
#endif
}

at::Tensor dsa_keep_step(const at::Tensor& scores_in, const at::Tensor& positions_in, double ratio,
                         int64_t local_window, int64_t window) {
  if (!dsa_keep_fusable(scores_in, local_window))
    throw Error("dsa_keep_step: no fused kernel for scores " + shape_text(scores_in) +
                " here (check dsa_keep_fusable)");
  if (positions_in.dim() != 1 || positions_in.size(0) != scores_in.size(0) ||
      positions_in.device() != scores_in.device())
    throw Error("dsa_keep_step: positions must be [B] on the scores' device");
#ifdef SLM_WITH_CUDA
  const c10::cuda::CUDAGuard guard(scores_in.device());
  const auto scores = scores_in.contiguous();
  const auto positions = positions_in.to(at::kLong).contiguous();
  auto keep = at::empty(scores.sizes(), scores.options().dtype(at::kBool));
  const std::string err =
      cuda::dsa_keep_step(decode_dtype(scores.scalar_type()), scores.data_ptr(), positions.data_ptr<int64_t>(),
                          scores.size(0), scores.size(1), ratio, local_window, window,
                          reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()), current_stream(scores));
  if (!err.empty()) throw Error("dsa_keep_step: " + err);
  return keep;
#else
  (void)ratio, (void)window;
  throw Error("dsa_keep_step: a CPU build has no fused kernel");
#endif
}

}  // namespace slm::ops
