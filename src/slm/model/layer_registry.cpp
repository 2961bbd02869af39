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
      {'A', "AttentionLayer", "attention-only layer (GQA with RoPE and QK-norm, or MLA; per-layer window; DSA)"},
      {'E', "MoELayer", "fine-grained MoE channel layer (routed + shared SwiGLU experts)"},
      {'F', "MLPLayer", "dense SwiGLU channel layer"},
      {'M', "Mamba3Layer", "Mamba-3 mixer layer (SISO or MIMO)"},
      {'R', "M2RNNLayer", "M2RNN recurrent mixer layer"},
  };
  return kinds;
}

const LayerKind& layer_kind(char letter) {
  for (const auto& k : layer_kinds())
    if (k.letter == letter) return k;
  throw Error(std::string("no layer class owns pattern letter '") + letter + "'");
}

std::shared_ptr<Layer> make_layer(const Recipe& r, const LayerPlan& l, const torch::TensorOptions& options) {
  switch (l.letter) {
    case 'A': return std::make_shared<AttentionLayer>(r, l, options);
    case 'E': return std::make_shared<MoELayer>(r, options);
    case 'F': return std::make_shared<MLPLayer>(r, options);
    case 'M': return std::make_shared<Mamba3Layer>(r, options);
    case 'R': return std::make_shared<M2RNNLayer>(r, options);
  }
  throw Error(r.source + ": layer " + std::to_string(l.index) + ": no implementation for pattern letter '" +
              std::string(1, l.letter) + "'");
}

}  // namespace slm::model
