#include "slm/quant/quantize_checkpoint.h"

#include <fnmatch.h>

#include <cmath>

#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/format.h"

namespace slm::nvfp4 {

namespace {

// Table rows: the quantized families by module group, the dense ones by kind.
std::string family(const ParamSpec& p) {
  switch (p.kind) {
    case ParamKind::Linear: return p.mtp ? "mtp" : p.group == "moe" ? "moe_shared" : p.group;
    case ParamKind::Expert: return "moe_experts";
    case ParamKind::Table: return "engram_table";
    case ParamKind::Head: return "lm_head";
    case ParamKind::Mixing: return "mhc";
    case ParamKind::Scalar: return "vector";
    default: return kind_name(p.kind);
  }
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

TensorPlan plan_tensor(const ParamSpec& spec, const std::vector<std::string>& keep_patterns, bool quantize_head,
                       bool quantize_embedding) {
  TensorPlan p;
  p.family = family(spec);
  const bool asked =
      (quantize_head && spec.kind == ParamKind::Head) || (quantize_embedding && spec.kind == ParamKind::Embedding);
  if (!spec.quantized() && !asked) {
    p.reason = kind_name(spec.kind);
  } else {
    for (const auto& pat : keep_patterns)
      if (fnmatch(pat.c_str(), spec.name.c_str(), 0) == 0) {
        p.reason = "--keep-bf16 " + pat;
        break;
      }
  }
  p.quantize = p.reason.empty();
  return p;
}

QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out, const Recipe& recipe,
                                   const std::vector<std::string>& keep_patterns, bool quantize_head,
                                   bool quantize_embedding) {
  Checkpoint src = load_checkpoint(in);
  make_parent_dirs(out);  // before the work, so a path that cannot be written fails fast
  std::map<std::string, ParamSpec> specs;
  for (auto& p : account(recipe, make_plan(recipe)).params) specs.emplace(p.name, std::move(p));
  for (const auto& [name, spec] : specs) {
    std::vector<int64_t> want(spec.shape.begin(), spec.shape.end()), have;
    if (auto d = src.dense.find(name); d != src.dense.end())
      have = d->second.sizes().vec();
    else if (auto q = src.quantized.find(name); q != src.quantized.end())
      have = q->second.shape;
    else
      throw Error(in + ": tensor " + name + " is missing (recipe " + recipe.source + " declares it)");
    if (have != want)
      throw Error(in + ": tensor " + name + " has shape " + shape_text(have) + ", recipe " + recipe.source +
                  " declares " + shape_text(want));
  }
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
    auto spec = specs.find(name);
    TensorPlan p = spec != specs.end() ? plan_tensor(spec->second, keep_patterns, quantize_head, quantize_embedding)
                                       : TensorPlan{"buffer", false, "not a parameter of the recipe"};
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
