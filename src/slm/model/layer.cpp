#include "slm/model/layer.h"

namespace slm::model {

Layer::Layer(int64_t d_model, double eps, const torch::TensorOptions& options) {
  norm = register_module("norm", RMSNorm(d_model, eps, options));
}

}  // namespace slm::model
