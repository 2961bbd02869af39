#include "slm/model/weights.h"

#include <torch/torch.h>

#include <filesystem>
#include <set>

#include "slm/quant/nvfp4_store.h"
#include "slm/recipe/accounting.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

std::map<std::string, torch::Tensor> named_state(const HybridLM& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model.named_parameters(true)) out[p.key()] = p.value();
  for (const auto& b : model.named_buffers(true)) out[b.key()] = b.value();
  return out;
}

namespace {

// Every weight the model can run in NVFP4, by parameter name: the Linears' weights and the stacked expert tensors.
std::map<std::string, Weight*> nvfp4_slots(const HybridLM& model) {
  std::map<std::string, Weight*> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* lin = item.value()->as<LinearImpl>()) {
      out[item.key() + ".weight"] = &lin->weight;
    } else if (auto* ex = item.value()->as<ExpertsImpl>()) {
      out[item.key() + ".w13"] = &ex->w13;
      out[item.key() + ".w2"] = &ex->w2;
    }
  }
  return out;
}

}  // namespace

void save_weights(const HybridLM& model, const std::string& path, const safetensors::Metadata& extra) {
  auto quantized = nvfp4_weights(model);
  if (!quantized.empty())
    throw Error(path + ": cannot save a model that runs NVFP4 weights (" + quantized.front() +
                " and others): its dense weights were released at load");
  safetensors::Metadata meta = extra;
  meta["format"] = "slm-weights";
  meta["recipe"] = model.recipe().name;
  std::map<std::string, torch::Tensor> tensors;
  for (auto& [name, t] : named_state(model)) tensors[name] = t.detach();
  safetensors::save(path, tensors, meta);
}

void load_weights(HybridLM& model, const std::string& path) {
  // Dense tensors and the NVFP4 entries, each entry already checked for consistent buffers and scales.
  nvfp4::Checkpoint file = nvfp4::load_checkpoint(path);
  auto state = named_state(model);
  auto not_in_model = [&](const std::string& name) {
    return Error(path + ": tensor " + name + " is not part of the model built from " + model.recipe().source);
  };
  for (const auto& [name, t] : file.dense)
    if (!state.count(name)) throw not_in_model(name);
  const auto slots = nvfp4_slots(model);
  std::set<std::string> quantizable;
  for (const auto& p : account(model.recipe(), model.plan()).params)
    if (p.quantized() || p.kind == ParamKind::Head || p.kind == ParamKind::Embedding) quantizable.insert(p.name);
  for (const auto& [name, q] : file.quantized) {
    auto it = state.find(name);
    if (it == state.end()) throw not_in_model(name);
    if (!quantizable.count(name))
      throw Error(path + ": tensor " + name +
                  " is stored in NVFP4, but the model runs it dense (only linear projections, expert weights, the "
                  "LM head, the token embedding and Engram tables may be quantized)");
    if (q.shape != it->second.sizes().vec())
      throw Error(path + ": NVFP4 tensor " + name + " has shape " + shape_text(q.shape) + ", the model needs " +
                  shape_text(it->second.sizes()));
  }
  // Check everything before copying anything, so a bad file leaves the model as it was.
  for (const auto& [name, t] : state) {
    if (file.quantized.count(name)) continue;
    auto it = file.dense.find(name);
    if (it == file.dense.end())
      throw Error(path + ": tensor " + name + " is missing (the model built from " + model.recipe().source +
                  " needs it)");
    if (it->second.sizes() != t.sizes())
      throw Error(path + ": tensor " + name + " has shape " + shape_text(it->second.sizes()) + ", the model needs " +
                  shape_text(t.sizes()));
    // Integer buffers (Engram hashing) stay integers; floating tensors are converted to the model's dtype.
    if (it->second.is_floating_point() != t.is_floating_point())
      throw Error(path + ": tensor " + name + " has dtype " + safetensors::dtype_name(it->second.scalar_type()) +
                  ", the model holds " + safetensors::dtype_name(t.scalar_type()));
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : state)
    if (!file.quantized.count(name)) t.copy_(file.dense.at(name).to(t.device(), t.scalar_type()));
  if (file.quantized.empty()) return;
  for (auto& p : model.parameters()) p.requires_grad_(false);
  std::map<std::string, nvfp4::QTensor> matrices;
  for (auto& [name, q] : file.quantized) {
    if (slots.count(name))
      matrices.emplace(name, std::move(q));
    else  // the token embedding and Engram tables are gathered row by row, not multiplied: a dequantized copy
      state.at(name).copy_(
          nvfp4::dequantize(q, torch::kFloat).to(state.at(name).device(), state.at(name).scalar_type()));
  }
  use_nvfp4_weights(model, std::move(matrices));
}

void use_nvfp4_weights(HybridLM& model, std::map<std::string, nvfp4::QTensor> quantized) {
  const auto slots = nvfp4_slots(model);
  const auto state = named_state(model);
  for (const auto& [name, q] : quantized) {
    if (!slots.count(name))
      throw Error("NVFP4: " + name + " is not a linear weight or a stacked expert tensor of the model");
    if (q.shape != state.at(name).sizes().vec())
      throw Error("NVFP4 tensor " + name + " has shape " + shape_text(q.shape) + ", the model needs " +
                  shape_text(state.at(name).sizes()));
  }
  if (quantized.empty()) return;
  for (auto& p : model.parameters()) p.requires_grad_(false);
  for (auto& [name, q] : quantized) slots.at(name)->use_nvfp4(std::move(q), name);
}

std::vector<std::string> nvfp4_weight_slots(const HybridLM& model) {
  std::vector<std::string> out;
  for (const auto& [name, slot] : nvfp4_slots(model)) out.push_back(name);
  return out;
}

std::vector<std::string> nvfp4_weights(const HybridLM& model) {
  std::vector<std::string> out;
  for (const auto& [name, slot] : nvfp4_slots(model))
    if (slot->is_nvfp4()) out.push_back(name);
  return out;
}

WeightMemory weight_memory(const HybridLM& model) {
  WeightMemory m;
  auto dense = [&](const torch::Tensor& t) {
    m.dense_bytes += static_cast<int64_t>(t.nbytes());
    if (t.numel() > 0) m.devices.insert(t.device().str());
  };
  for (const auto& p : model.parameters()) dense(p);
  for (const auto& b : model.buffers()) dense(b);
  auto packed = [&](const nvfp4::QTensor& q) {
    m.nvfp4_bytes += q.storage_bytes();
    m.devices.insert(q.codes.device().str());
  };
  for (const auto& [name, slot] : nvfp4_slots(model)) {
    if (slot->is_nvfp4()) packed(slot->nvfp4());
  }
  return m;
}

std::string weights_path(const std::string& checkpoint) {
  namespace fs = std::filesystem;
  if (fs::is_directory(checkpoint)) return (fs::path(checkpoint) / "model.safetensors").string();
  return checkpoint;
}

}  // namespace slm::model
