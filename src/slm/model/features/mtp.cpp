#include "slm/model/features/mtp.h"

#include <torch/torch.h>

#include "slm/model/layer_registry.h"
#include "slm/util/error.h"

namespace slm::model {

MtpModuleImpl::MtpModuleImpl(const Recipe& r, const ModelPlan& plan, const torch::TensorOptions& options) {
  enorm = register_module("enorm", RMSNorm(r.d_model, r.norm_eps, options));
  hnorm = register_module("hnorm", RMSNorm(r.d_model, r.norm_eps, options));
  proj = register_module("proj", Linear(2 * r.d_model, r.d_model, options));
  layer_list = register_module("layers", torch::nn::ModuleList());
  for (const auto& l : plan.mtp_layers) {
    layers.push_back(make_layer(r, l, options));
    layer_list->push_back(layers.back());
  }
  norm = register_module("norm", RMSNorm(r.d_model, r.norm_eps, options));
}

torch::Tensor MtpModuleImpl::input(const torch::Tensor& h_prev, const torch::Tensor& emb) {
  return proj(torch::cat({enorm(emb), hnorm(h_prev)}, -1));
}

torch::Tensor MtpModuleImpl::forward(const torch::Tensor& h_prev, const torch::Tensor& emb, const Documents* docs) {
  auto x = input(h_prev, emb);
  for (auto& layer : layers) x = x + layer->forward(x, docs);
  return x;
}

torch::Tensor MtpModuleImpl::prefill(const torch::Tensor& h_prev, const torch::Tensor& emb,
                                     std::vector<std::unique_ptr<LayerCache>>& caches) {
  if (caches.size() != layers.size()) throw Error("MTP module: one cache per layer expected");
  auto x = input(h_prev, emb);
  for (size_t l = 0; l < layers.size(); ++l) x = x + layers[l]->prefill(x, caches[l].get());
  return x;
}

}  // namespace slm::model
