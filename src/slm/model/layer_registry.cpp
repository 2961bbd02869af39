#include "slm/model/layer_registry.h"

#include <torch/torch.h>

#include "slm/model/layers/attention.h"
#include "slm/model/layers/m2rnn.h"
#include "slm/model/layers/mamba3.h"
#include "slm/model/layers/mlp.h"
#include "slm/model/layers/moe.h"
#include "slm/util/error.h"

namespace slm::model {

const std::vector<LayerKind>& layer_kinds() {
  static const std::vector<LayerKind> kinds = {
      {Family::Attention, "AttentionLayer",
       "attention-only layer (GQA with RoPE and QK-norm, or MLA; per-layer window; DSA)"},
      {Family::MoE, "MoELayer", "fine-grained MoE channel layer (routed + shared SwiGLU experts)"},
      {Family::MLP, "MLPLayer", "dense SwiGLU channel layer"},
      {Family::Mamba3, "Mamba3Layer", "Mamba-3 mixer layer (SISO or MIMO)"},
      {Family::M2RNN, "M2RNNLayer", "M2RNN recurrent mixer layer"},
  };
  return kinds;
}

const LayerKind& layer_kind(Family family) {
  for (const auto& k : layer_kinds())
    if (k.family == family) return k;
  throw Error(std::string("no layer class builds block family '") + family_name(family) + "'");
}

const LayerKind& layer_kind(char letter) {
  return layer_kind(pattern_letter(letter).family);
}

std::shared_ptr<Layer> make_layer(const Recipe& r, const LayerPlan& l, const torch::TensorOptions& options) {
  switch (l.family) {
    case Family::Attention: return std::make_shared<AttentionLayer>(r, l, options);
    case Family::MoE: return std::make_shared<MoELayer>(r, options);
    case Family::MLP: return std::make_shared<MLPLayer>(r, options);
    case Family::Mamba3: return std::make_shared<Mamba3Layer>(r, options);
    case Family::M2RNN: return std::make_shared<M2RNNLayer>(r, options);
  }
  throw Error(r.source + ": layer " + std::to_string(l.index) + ": no implementation for block family '" +
              family_name(l.family) + "'");
}

}  // namespace slm::model
