#include "slm/ops/moe_combine.h"

#include <torch/torch.h>

#include "slm/ops/decode_dtype.h"
#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/moe_combine_kernel.h"
#endif

namespace slm::ops {

#ifdef SLM_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FusedMoeCombine : public torch::autograd::Function<FusedMoeCombine> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ys, const at::Tensor& inv, const at::Tensor& w) {
    const c10::cuda::CUDAGuard guard(ys.device());
    const int64_t k = w.size(1), tokens = w.size(0), d = ys.size(1);
    auto out = at::empty({tokens, d}, ys.options());
    check_launch(cuda::moe_combine_forward(decode_dtype(ys.scalar_type()), ys.data_ptr(), inv.data_ptr<int64_t>(),
                                           w.data_ptr<float>(), out.data_ptr(), tokens, static_cast<int>(k), d,
                                           current_stream(ys)));
    ctx->save_for_backward({ys, inv, w});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &ys = saved[0], &inv = saved[1], &w = saved[2];
    const c10::cuda::CUDAGuard guard(ys.device());
    const auto g = grads[0].to(ys.scalar_type()).contiguous();
    auto dys = at::empty_like(ys), dw = at::empty_like(w);
    check_launch(cuda::moe_combine_backward(
        decode_dtype(ys.scalar_type()), g.data_ptr(), ys.data_ptr(), inv.data_ptr<int64_t>(), w.data_ptr<float>(),
        dys.data_ptr(), dw.data_ptr<float>(), w.size(0), static_cast<int>(w.size(1)), ys.size(1), current_stream(ys)));
    return {dys, {}, dw};
  }
};

}  // namespace
#endif

bool moe_combine_fusable(const at::Tensor& ys, const at::Tensor& inv, const at::Tensor& w) {
#ifdef SLM_WITH_CUDA
  if (!fused_kernels_enabled() || !ys.defined() || !ys.is_cuda() || ys.dim() != 2 || !ys.is_contiguous()) return false;
  const auto dt = ys.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16) return false;
  const int64_t per16 = dt == at::kFloat ? 4 : 8;
  return w.defined() && w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_contiguous() &&
         w.device() == ys.device() && w.size(1) >= 1 && w.size(1) <= cuda::kMoeCombineMaxK && w.numel() == ys.size(0) &&
         inv.defined() && inv.scalar_type() == at::kLong && inv.is_contiguous() && inv.numel() == ys.size(0) &&
         inv.device() == ys.device() && ys.size(1) % per16 == 0 && reinterpret_cast<uintptr_t>(ys.data_ptr()) % 16 == 0;
#else
  (void)ys, (void)inv, (void)w;
  return false;
#endif
}

at::Tensor moe_combine(const at::Tensor& ys, const at::Tensor& inv, const at::Tensor& w) {
  if (!moe_combine_fusable(ys, inv, w))
    throw Error("moe_combine: no fused kernel for these rows, indices and gates (check moe_combine_fusable)");
#ifdef SLM_WITH_CUDA
  return FusedMoeCombine::apply(ys, inv, w);
#else
  return {};
#endif
}

}  // namespace slm::ops
