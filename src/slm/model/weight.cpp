#include "slm/model/weight.h"

#include "slm/ops/gathered_linear.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

namespace {
torch::Tensor nvfp4_linear(const torch::Tensor& x, const nvfp4::QTensor& q) {
  if (x.requires_grad() && torch::GradMode::is_enabled())
    throw Error("NVFP4 weights are inference-only: the input requires a gradient (load a dense checkpoint to train)");
  return nvfp4::linear(x, q, x.scalar_type());
}
}  // namespace

const nvfp4::QTensor& Weight::nvfp4() const {
  if (!nvfp4_) throw Error("weight: dense, not NVFP4");
  return nvfp4_->whole;
}

const nvfp4::QTensor& Weight::nvfp4(int64_t e) const {
  if (!nvfp4_ || nvfp4_->matrices.empty()) throw Error("weight: not a stack of NVFP4 matrices");
  return nvfp4_->matrices.at(static_cast<size_t>(e));
}

torch::Tensor Weight::linear(const torch::Tensor& x) const {
  return nvfp4_ ? nvfp4_linear(x, nvfp4_->whole) : ops::small_batch_linear(x, dense_);
}

torch::Tensor Weight::linear(const torch::Tensor& x, int64_t e) const {
  return nvfp4_ ? nvfp4_linear(x, nvfp4(e)) : at::linear(x, dense_[e]);
}

void Weight::use_nvfp4(nvfp4::QTensor q, const std::string& name) {
  if (q.shape != dense_.sizes().vec())
    throw Error("tensor " + name + " is NVFP4 of shape " + shape_text(q.shape) + ", the model needs " +
                shape_text(dense_.sizes()));
  Nvfp4 form{q.to(dense_.device()), {}};
  if (form.whole.shape.size() == 3)
    for (int64_t e = 0; e < form.whole.shape[0]; ++e) form.matrices.push_back(form.whole.matrix(e));
  torch::NoGradGuard no_grad;
  dense_.set_(torch::empty({0}, dense_.options()));  // frees the dense storage; the registered parameter is this tensor
  nvfp4_ = std::move(form);
}

int64_t Weight::bytes() const {
  return nvfp4_ ? nvfp4_->whole.storage_bytes() : static_cast<int64_t>(dense_.nbytes());
}

}  // namespace slm::model
