#pragma once
// Checkpoint quantization (`slm quantize`): linear weights (attention/MLP/Mamba/M2RNN/Engram projections, shared
// and routed experts, MTP projections) and Engram tables go to NVFP4; embeddings, the LM head, norms, router gates,
// DSA indexer and mHC mixing weights, convolutions and small vectors stay dense, converted to BF16.
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace slm::nvfp4 {

struct TensorPlan {
  std::string family;  // table row: embedding, lm_head, norm, router, attention, mlp, moe_experts, ...
  bool quantize = false;
  std::string reason;  // why it stays dense (empty when quantized)
};

// The decision for one tensor by name and shape; keep_patterns are glob patterns (fnmatch) on the full name
// that force BF16.
TensorPlan plan_tensor(const std::string& name, const torch::Tensor& t, const std::vector<std::string>& keep_patterns);

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

// Reads a safetensors checkpoint (tensors already in NVFP4 pass through), writes the NVFP4 checkpoint atomically.
QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out,
                                   const std::vector<std::string>& keep_patterns);

}  // namespace slm::nvfp4
