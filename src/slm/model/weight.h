#pragma once
// A weight in the form a layer multiplies by it, one of
//   dense: the registered parameter itself ([out, in], or [E, out, in] for stacked experts; FP32, BF16 or FP64),
//          trainable;
//   NVFP4: its packed codes and block scales (quant/nvfp4.h), for inference. The registered parameter is released to
//          no elements and stays registered, so that its dtype and device still describe the model. A stack keeps
//          its experts' matrices too, sharing the storage.
// Linear and the MoE experts hold one Weight per matrix and multiply through linear(); the MoE backends ask its kind.
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "slm/quant/nvfp4.h"

namespace slm::model {

class Weight {
 public:
  Weight() = default;
  // parameter: the tensor register_parameter returned (its handle; moves and casts keep its identity).
  explicit Weight(torch::Tensor parameter) : dense_(std::move(parameter)) {}

  // The registered parameter; empty once NVFP4 replaced it.
  torch::Tensor& dense() { return dense_; }
  const torch::Tensor& dense() const { return dense_; }
  bool is_nvfp4() const { return nvfp4_.has_value(); }
  // The NVFP4 form: the whole tensor, or expert e's [out, in] matrix of a stack. slm::Error when dense.
  const nvfp4::QTensor& nvfp4() const;
  const nvfp4::QTensor& nvfp4(int64_t e) const;

  // x · W^T, or x · W[e]^T for expert e of a stack. NVFP4 is computed in FP32 and returned in x's dtype, and is
  // inference-only: an x that requires a gradient is an slm::Error.
  torch::Tensor linear(const torch::Tensor& x) const;
  torch::Tensor linear(const torch::Tensor& x, int64_t e) const;

  // Replaces the dense form by q, moved to the parameter's device; slm::Error naming `name` unless q's shape is the
  // parameter's.
  void use_nvfp4(nvfp4::QTensor q, const std::string& name);
  // Bytes the form it runs in occupies (the NVFP4 codes and scales, or the dense parameter).
  int64_t bytes() const;

 private:
  torch::Tensor dense_;
  struct Nvfp4 {
    nvfp4::QTensor whole;
    std::vector<nvfp4::QTensor> matrices;  // a stack's experts; empty for a 2-D weight
  };
  std::optional<Nvfp4> nvfp4_;
};

}  // namespace slm::model
