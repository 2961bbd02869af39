#include "slm/model/modules.h"

#include <torch/torch.h>

#include <cmath>

#include "slm/ops/gathered_linear.h"
#include "slm/ops/rms_norm.h"
#include "slm/ops/swiglu.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

void init_fan_in_uniform(torch::Tensor& w, int64_t fan_in, double gain) {
  torch::NoGradGuard no_grad;
  const double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in));
  w.uniform_(-bound, bound);
}

LinearImpl::LinearImpl(int64_t in, int64_t out, const torch::TensorOptions& options) {
  weight = register_parameter("weight", torch::empty({out, in}, options));
  init_fan_in_uniform(weight, in);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  return linear_or_nvfp4(x, weight, qweight ? &*qweight : nullptr);
}

void LinearImpl::use_nvfp4(nvfp4::QTensor q, const std::string& name) {
  qweight = replace_by_nvfp4(weight, std::move(q), name);
}

torch::Tensor linear_or_nvfp4(const torch::Tensor& x, const torch::Tensor& w, const nvfp4::QTensor* q) {
  if (!q) return ops::small_batch_linear(x, w);
  if (x.requires_grad() && torch::GradMode::is_enabled())
    throw Error("NVFP4 weights are inference-only: the input requires a gradient (load a dense checkpoint to train)");
  return nvfp4::linear(x, *q, x.scalar_type());
}

nvfp4::QTensor replace_by_nvfp4(torch::Tensor& w, nvfp4::QTensor q, const std::string& name) {
  if (q.shape != w.sizes().vec())
    throw Error("tensor " + name + " is NVFP4 of shape " + shape_text(q.shape) + ", the model needs " +
                shape_text(w.sizes()));
  nvfp4::QTensor on_device = q.to(w.device());
  torch::NoGradGuard no_grad;
  w.set_(torch::empty({0}, w.options()));  // frees the dense storage; the registered parameter is this tensor
  return on_device;
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, const torch::TensorOptions& options) {
  weight = register_parameter("weight", torch::empty({vocab, dim}, options));
  torch::NoGradGuard no_grad;
  weight.normal_();
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& tokens) {
  return at::embedding(weight, tokens);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, const torch::TensorOptions& options) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}, options));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return ops::rms_norm(x, weight, eps);
}

SwiGLUImpl::SwiGLUImpl(int64_t d_model, int64_t hidden, const torch::TensorOptions& options) {
  w13 = register_module("w13", Linear(d_model, 2 * hidden, options));
  w2 = register_module("w2", Linear(hidden, d_model, options));
  // Output projections start at zero so a fresh layer is the identity on the residual stream (nanochat).
  torch::NoGradGuard no_grad;
  w2->weight.zero_();
}

torch::Tensor swiglu_activation(const torch::Tensor& h) {
  return ops::swiglu(h);
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  return w2(swiglu_activation(w13(x)));
}

}  // namespace slm::model
