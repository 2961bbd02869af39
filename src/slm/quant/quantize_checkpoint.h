#pragma once
// Checkpoint quantization (`slm quantize`). What goes to NVFP4 is what the recipe's accounting marks quantizable
// (ParamSpec::quantized(): linear projections of every family, shared and routed experts, MTP projections, Engram
// tables), the same rule nvfp4_bytes() sizes and the model's NVFP4 loader accepts; embeddings, the LM head, norms,
// router gates, DSA indexer and mHC mixing weights, convolutions, vectors and buffers stay dense, in BF16. The LM
// head is quantized only when asked (quantize_head): it is the largest single read of a small model's decode step
// (bench/RESULTS.md, "The NVFP4 LM head"), and the model runs it through the same NVFP4 linear. The token embedding
// is quantized only when asked (quantize_embedding): it is gathered, not multiplied, so the model dequantizes it once
// at load; what it saves is file size (a shipped small specialist, where the embedding is a large share of the file).
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "slm/recipe/accounting.h"

namespace slm::nvfp4 {

struct TensorPlan {
  std::string family;  // table row: embedding, lm_head, norm, router, attention, mlp, moe_experts, ...
  bool quantize = false;
  std::string reason;  // why it stays dense (empty when quantized)
};

// The decision for one tensor the recipe declares; keep_patterns are glob patterns (fnmatch) on the full name
// that force BF16.
TensorPlan plan_tensor(const ParamSpec& spec, const std::vector<std::string>& keep_patterns, bool quantize_head = false,
                       bool quantize_embedding = false);

struct FamilyStats {
  int64_t tensors = 0;
  int64_t quantized = 0;
  int64_t bytes_in = 0;    // as stored in the input
  int64_t bytes_bf16 = 0;  // the same tensors in BF16 (integer tensors as stored)
  int64_t bytes_out = 0;   // in the output (NVFP4 buffers, or BF16)
  double err2 = 0;         // sum of squared quantization errors over quantized tensors
  double ref2 = 0;         // sum of squared values over quantized tensors
  double rel_rms() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0; }
  void add(const FamilyStats& o);
};

struct QuantizeReport {
  std::map<std::string, FamilyStats> families;
  FamilyStats total;
};

// Reads a safetensors checkpoint of the model `recipe` describes and writes the NVFP4 checkpoint atomically. Every
// tensor the recipe declares must be there with its shape (else slm::Error naming the file and the tensor); other
// tensors (the MoE balancing-bias buffers) stay dense; tensors already in NVFP4 pass through.
QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out, const Recipe& recipe,
                                   const std::vector<std::string>& keep_patterns, bool quantize_head = false,
                                   bool quantize_embedding = false);

}  // namespace slm::nvfp4
