#pragma once
// F: a dense SwiGLU channel layer (the E slots moe.layer_freq skips become F, and MTP modules may use F).
#include "slm/model/layer.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

class MLPLayer : public Layer {
 public:
  MLPLayer(const Recipe& recipe, const torch::TensorOptions& options);
  Family family() const override { return Family::MLP; }
  const char* class_name() const override { return "MLPLayer"; }
  torch::Tensor forward_normed(const torch::Tensor& h, const Documents* docs = nullptr) override;  // per token
  torch::Tensor prefill(const torch::Tensor& x, LayerCache* cache) override;
  std::unique_ptr<LayerCache> make_cache(int64_t, int64_t, int64_t) const override { return nullptr; }

  SwiGLU mlp{nullptr};
};

}  // namespace slm::model
