#pragma once
// One DeepSeek-V3 multi-token-prediction module. Module k (1-based) at position i combines the previous
// depth's hidden h^{k-1}_i with the embedding of token t_{i+k}:
//   h' = proj([enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)])      (embedding first, as vLLM/SGLang load V3 weights)
// runs its own layers (plan.mtp_layers, plain residual x + layer(x)), and predicts t_{i+k+1} through its
// "norm" and the main model's LM head.
#include <torch/nn/modules/container/modulelist.h>

#include <memory>
#include <vector>

#include "slm/model/layer.h"
#include "slm/recipe/plan.h"

namespace slm::model {

class MtpModuleImpl : public torch::nn::Module {
 public:
  MtpModuleImpl(const Recipe& recipe, const ModelPlan& plan, const torch::TensorOptions& options);
  // h_prev [B, n, D] and emb [B, n, D] (embeddings of the tokens k ahead) -> h^k [B, n, D], before "norm".
  // docs (optional): the packed documents of the n positions, for the module's layers.
  torch::Tensor forward(const torch::Tensor& h_prev, const torch::Tensor& emb, const Documents* docs = nullptr);
  // The same for positions that continue the ones caches (made by the layers' make_cache, one per layer) hold.
  torch::Tensor prefill(const torch::Tensor& h_prev, const torch::Tensor& emb,
                        std::vector<std::unique_ptr<LayerCache>>& caches);

  RMSNorm enorm{nullptr}, hnorm{nullptr}, norm{nullptr};
  Linear proj{nullptr};
  torch::nn::ModuleList layer_list{nullptr};
  std::vector<std::shared_ptr<Layer>> layers;

 private:
  torch::Tensor input(const torch::Tensor& h_prev, const torch::Tensor& emb);
};
TORCH_MODULE(MtpModule);

}  // namespace slm::model
