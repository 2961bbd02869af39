#include "slm/quant/quantize_checkpoint.h"

#include <fnmatch.h>

#include <cmath>

#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/util/error.h"

namespace slm::nvfp4 {

namespace {

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
bool ends(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Projection family of a 2-D weight from its module path (names as in recipe/accounting.cpp).
std::string projection_family(const std::string& name) {
  if (has(name, "mtp")) return "mtp";
  if (has(name, "attn.")) return "attention";
  if (has(name, "moe.shared.")) return "moe_shared";
  if (has(name, "mlp.")) return "mlp";
  if (has(name, "mamba.")) return "mamba3";
  if (has(name, "m2rnn.")) return "m2rnn";
  if (has(name, "engram.")) return "engram";
  return "linear_other";
}

int64_t bf16_bytes(const torch::Tensor& t) {
  return t.is_floating_point() ? t.numel() * 2 : t.numel() * static_cast<int64_t>(t.element_size());
}

}  // namespace

void FamilyStats::add(const FamilyStats& o) {
  tensors += o.tensors;
  quantized += o.quantized;
  bytes_in += o.bytes_in;
  bytes_bf16 += o.bytes_bf16;
  bytes_out += o.bytes_out;
  err2 += o.err2;
  ref2 += o.ref2;
}

TensorPlan plan_tensor(const std::string& name, const torch::Tensor& t, const std::vector<std::string>& keep_patterns) {
  TensorPlan p;
  const int64_t dim = t.dim();
  if (has(name, "engram.table")) {
    p.family = "engram_table";
  } else if (has(name, "embed")) {
    p.family = "embedding";
    p.reason = "embedding";
  } else if (has(name, "lm_head") || name == "head.weight" || name == "output.weight") {
    p.family = "lm_head";
    p.reason = "LM head";
  } else if (has(name, "norm")) {
    p.family = "norm";
    p.reason = "norm";
  } else if (has(name, "router") || ends(name, ".gate.weight")) {
    p.family = "router";
    p.reason = "router gate";
  } else if (has(name, "indexer")) {
    p.family = "indexer";
    p.reason = "DSA indexer";
  } else if (has(name, "mhc.")) {
    p.family = "mhc";
    p.reason = "mHC mixing";
  } else if (has(name, ".conv.")) {
    p.family = "conv";
    p.reason = "convolution";
  } else if (has(name, "experts.") && dim == 3) {
    p.family = "moe_experts";
  } else if (dim == 2 && ends(name, ".weight")) {
    p.family = projection_family(name);
  } else {
    p.family = "vector";
    p.reason = "small vector/scalar";
  }
  if (p.reason.empty()) {
    if (!t.is_floating_point()) {
      p.reason = "not floating";
    } else if (dim < 2 || dim > 3) {
      p.reason = "not a matrix";
    } else if (t.size(-1) < 16 || t.numel() < 1024) {
      p.reason = "small";
    } else {
      for (const auto& pat : keep_patterns)
        if (fnmatch(pat.c_str(), name.c_str(), 0) == 0) {
          p.reason = "--keep-bf16 " + pat;
          break;
        }
    }
  }
  p.quantize = p.reason.empty();
  return p;
}

QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out,
                                   const std::vector<std::string>& keep_patterns) {
  Checkpoint src = load_checkpoint(in);
  Checkpoint dst;
  dst.metadata = src.metadata;
  dst.metadata["slm.quantized"] = "nvfp4";
  QuantizeReport report;
  for (auto& [name, q] : src.quantized) {  // already NVFP4: passes through
    FamilyStats& f = report.families["already_nvfp4"];
    f.tensors += 1;
    f.quantized += 1;
    f.bytes_in += q.storage_bytes();
    f.bytes_bf16 += q.numel() * 2;
    f.bytes_out += q.storage_bytes();
    dst.quantized.emplace(name, q);
  }
  for (auto& [name, t] : src.dense) {
    TensorPlan p = plan_tensor(name, t, keep_patterns);
    FamilyStats& f = report.families[p.family];
    f.tensors += 1;
    f.bytes_in += t.numel() * static_cast<int64_t>(t.element_size());
    f.bytes_bf16 += bf16_bytes(t);
    if (p.quantize) {
      QTensor q = quantize(t, {}, in + ": tensor " + name);
      torch::Tensor x = t.to(torch::kDouble);
      torch::Tensor d = dequantize(q, torch::kDouble);
      f.err2 += (x - d).pow(2).sum().item<double>();
      f.ref2 += x.pow(2).sum().item<double>();
      f.quantized += 1;
      f.bytes_out += q.storage_bytes();
      // The dtype tag records what dequantization gives back: BF16, as the dense tensors are stored.
      q.dtype = torch::kBFloat16;
      dst.quantized.emplace(name, std::move(q));
    } else {
      torch::Tensor o = t.is_floating_point() ? t.to(torch::kBFloat16) : t;
      f.bytes_out += o.numel() * static_cast<int64_t>(o.element_size());
      dst.dense.emplace(name, std::move(o));
    }
  }
  for (const auto& [fam, f] : report.families) report.total.add(f);
  save_checkpoint(out, dst);
  return report;
}

}  // namespace slm::nvfp4
