#include "slm/ops/cross_entropy.h"

#include <torch/torch.h>

#include "slm/ops/fused_kernels.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "slm/ops/cuda/cross_entropy_kernels.h"
#endif

namespace slm::ops {
namespace {

#ifdef SLM_WITH_CUDA
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cuda::LogitType logit_type(const at::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 ? cuda::LogitType::kBFloat16 : cuda::LogitType::kFloat;
}

class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t ignore_index) {
    const c10::cuda::CUDAGuard guard(logits.device());
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    auto f32 = logits.options().dtype(at::kFloat);
    auto lse = at::empty({rows}, f32), loss = at::empty({rows}, f32);
    check_launch(cuda::cross_entropy_forward(logit_type(logits), logits.data_ptr(), targets.data_ptr<int64_t>(), rows,
                                             vocab, ignore_index, lse.data_ptr<float>(), loss.data_ptr<float>(),
                                             current_stream(logits)));
    // The mean over the kept rows, as torch's: no kept row gives 0 / 0.
    auto count = targets.ne(ignore_index).sum().to(at::kFloat);
    ctx->save_for_backward({logits, targets, lse, count});
    ctx->saved_data["ignore_index"] = ignore_index;
    return loss.sum() / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &logits = saved[0], &targets = saved[1], &lse = saved[2], &count = saved[3];
    const c10::cuda::CUDAGuard guard(logits.device());
    const auto g = grads[0].to(at::kFloat).contiguous();
    auto dlogits = at::empty_like(logits);
    check_launch(cuda::cross_entropy_backward(logit_type(logits), logits.data_ptr(), targets.data_ptr<int64_t>(),
                                              lse.data_ptr<float>(), g.data_ptr<float>(), count.data_ptr<float>(),
                                              logits.size(0), logits.size(1), ctx->saved_data["ignore_index"].toInt(),
                                              dlogits.data_ptr(), current_stream(logits)));
    return {dlogits, {}, {}};
  }
};
#endif

}  // namespace

bool cross_entropy_fused(const at::Tensor& logits) {
#ifdef SLM_WITH_CUDA
  return logits.is_cuda() && logits.dim() == 2 && logits.is_contiguous() &&
         (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat);
#else
  (void)logits;
  return false;
#endif
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index) {
  if (!logits.defined() || logits.dim() != 2)
    throw Error("cross_entropy: logits must be [rows, vocab], got " + shape_text(logits));
  if (!targets.defined() || targets.dim() != 1 || targets.size(0) != logits.size(0) ||
      targets.scalar_type() != at::kLong)
    throw Error("cross_entropy: targets must be int64 [" + std::to_string(logits.size(0)) + "], got " +
                shape_text(targets));
#ifdef SLM_WITH_CUDA
  if (cross_entropy_fused(logits)) return FusedCrossEntropy::apply(logits, targets.contiguous(), ignore_index);
#endif
  const auto x = logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat);
  return torch::nn::functional::cross_entropy(
      x, targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index));
}

}  // namespace slm::ops
