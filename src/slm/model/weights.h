#pragma once
// Model weights as a safetensors file under the stable parameter names of docs/recipes.md (plus the MoE
// balancing-bias buffers), so other tools can read them. Loading is strict: every tensor the model holds must
// be there with its shape, and nothing else may be; a mismatch names the file and the tensor.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "slm/io/safetensors.h"
#include "slm/model/hybrid_lm.h"
#include "slm/quant/nvfp4.h"

namespace slm::model {

// Every parameter and buffer by name.
std::map<std::string, torch::Tensor> named_state(const HybridLM& model);

// Atomically writes the weights; metadata gets "format" = "slm-weights" and "recipe" = the recipe's name.
// A model running NVFP4 weights is refused: its dense copies are gone.
void save_weights(const HybridLM& model, const std::string& path, const safetensors::Metadata& extra = {});

// Copies the file's tensors into the model (converted to the model's dtype and device). An NVFP4 checkpoint
// (`slm quantize`, docs/formats.md) may hold in NVFP4 the weights the recipe's accounting marks quantizable
// (ParamSpec::quantized()): linear projections and the stacked expert matrices then compute with nvfp4::linear
// and release their dense weights; Engram tables, which are gathered rather than multiplied, load dequantized. The
// model becomes inference-only (no parameter requires a gradient). Load into a freshly built model.
void load_weights(HybridLM& model, const std::string& path);

// Runs these weights in NVFP4 from now on, as load_weights does with an NVFP4 checkpoint's matrices: each name a
// Linear's weight or a stacked expert tensor (nvfp4_weight_slots), each tensor of that weight's shape. Their dense
// copies are released and the model becomes inference-only. Everything is checked first: another name or a wrong
// shape is an slm::Error that leaves the model as it was.
void use_nvfp4_weights(HybridLM& model, std::map<std::string, nvfp4::QTensor> quantized);
// The names use_nvfp4_weights takes.
std::vector<std::string> nvfp4_weight_slots(const HybridLM& model);

// Names of the weights the model runs in NVFP4 (empty for a dense model).
std::vector<std::string> nvfp4_weights(const HybridLM& model);

// What the model's weights occupy: dense parameters and buffers at their dtype, NVFP4 matrices at their packed size
// (codes, block scales, tensor scales), and the devices holding any of them ("cpu", "cuda:0", ...).
struct WeightMemory {
  int64_t dense_bytes = 0, nvfp4_bytes = 0;
  std::set<std::string> devices;
  int64_t total() const { return dense_bytes + nvfp4_bytes; }
};
WeightMemory weight_memory(const HybridLM& model);

// A checkpoint argument is a weights file or a directory holding model.safetensors.
std::string weights_path(const std::string& checkpoint);

}  // namespace slm::model
