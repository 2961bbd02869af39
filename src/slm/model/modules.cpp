#include "slm/model/modules.h"

#include <torch/torch.h>

#include <cmath>

#include "slm/ops/rms_norm.h"
#include "slm/ops/swiglu.h"

namespace slm::model {

void init_fan_in_uniform(torch::Tensor& w, int64_t fan_in, double gain) {
  torch::NoGradGuard no_grad;
  const double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in));
  w.uniform_(-bound, bound);
}

LinearImpl::LinearImpl(int64_t in, int64_t out, const torch::TensorOptions& options)
    : weight(register_parameter("weight", torch::empty({out, in}, options))) {
  init_fan_in_uniform(weight.dense(), in);
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
  w2->weight.dense().zero_();
}

torch::Tensor swiglu_activation(const torch::Tensor& h) {
  return ops::swiglu(h);
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  return w2(swiglu_activation(w13(x)));
}

}  // namespace slm::model
