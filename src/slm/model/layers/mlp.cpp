#include "slm/model/layers/mlp.h"

#include <torch/torch.h>

namespace slm::model {

MLPLayer::MLPLayer(const Recipe& r, const torch::TensorOptions& options) : Layer(r.d_model, r.norm_eps, options) {
  mlp = register_module("mlp", SwiGLU(r.d_model, r.mlp->hidden, options));
}

torch::Tensor MLPLayer::forward_normed(const torch::Tensor& h, const Documents*) {
  return mlp(h);
}

torch::Tensor MLPLayer::prefill(const torch::Tensor& x, LayerCache*) {
  return mlp(norm(x));
}

}  // namespace slm::model
