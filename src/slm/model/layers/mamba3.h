#pragma once
// M: a Mamba-3 mixer layer (SISO, or MIMO of rank R), Lahoti et al., "Mamba-3", arXiv 2603.15569. The math
// lives in slm/ops/mamba3_scan.h; this class owns the parameters (names and shapes as in
// recipe/accounting.cpp) and runs them through one backend (Mamba3Backend), picked when the weights load or move.
#include <optional>
#include <utility>
#include <vector>

#include "slm/model/layer.h"
#include "slm/model/layers/recurrent_cache.h"
#include "slm/ops/mamba3_scan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

using Mamba3Cache = RecurrentCache<ops::Mamba3State>;

// How a Mamba-3 layer runs: one form for sequences (T > 1) and one for decode tokens (T == 1), each an
// implementation in ops/mamba3_scan.h. name() is what the profiler (a RecordFunction scope) and logs show.
struct Mamba3Backend {
  enum class Scan {
    Sequential,  // "sequential": the recurrence token by token, the reference (tests and benches choose it)
    Chunked,     // "chunked": mamba3_preprocess + mamba3_scan_chunked (the CPU, FP64, shapes without a kernel)
    Fused,       // "fused_scan": mamba3_scan_fused's CUDA kernels (FP32/BF16 on the GPU, the compiled head shapes)
  };
  enum class Step {
    Reference,  // "step": mamba3_preprocess + mamba3_step (MIMO, FP64, and any call that needs a gradient)
    Fused,      // "fused_step": mamba3_step_fused (SISO layers, FP32 on the CPU, FP32/BF16 on the GPU)
  };
  Scan scan = Scan::Chunked;
  Step step = Step::Reference;
  const char* name() const;  // "mamba3.<scan>+<step>"
  bool operator==(const Mamba3Backend&) const = default;
};

class Mamba3Impl : public torch::nn::Module {
 public:
  Mamba3Impl(const Recipe& recipe, const torch::TensorOptions& options);
  // h [B, T, D] (already normalized) continuing from state; returns the mixer output [B, T, D] and the state
  // after the last token. T > 1 runs the chunked form, T == 1 the decode step. start [B, T] (optional): where
  // packed documents begin (ops::mamba3_preprocess). state_in_place: a fused decode step may update state's ssm in
  // place (the returned state shares it), for a caller that keeps no earlier state.
  std::pair<torch::Tensor, ops::Mamba3State> forward(const torch::Tensor& h, const ops::Mamba3State& state,
                                                     const torch::Tensor& start = {}, bool state_in_place = false);
  // The same token by token (no packed documents), returning the state after each token too: the steps of a cache
  // that may roll back. Where the decode step is fused, in_proj and out_proj run over all T tokens at once.
  std::pair<torch::Tensor, std::vector<ops::Mamba3State>> steps(const torch::Tensor& h, const ops::Mamba3State& state);
  ops::Mamba3State zero_state(int64_t batch) const;
  ops::Mamba3Weights weights() const;
  // The backend for the current device and dtype: picked again only when one of them changed.
  const Mamba3Backend& backend();
  // Runs `forced` from now on instead of the pick (tests and benches comparing the forms); nullopt picks again.
  void force_backend(std::optional<Mamba3Backend> forced);

  int64_t d_inner, heads, headdim, d_state, rank, groups, angles, chunk_size;
  double a_floor;
  Linear in_proj{nullptr}, out_proj{nullptr};
  torch::Tensor dt_bias, B_bias, C_bias, D;
  torch::Tensor mimo_x, mimo_z, mimo_o;  // MIMO only
  RMSNorm B_norm{nullptr}, C_norm{nullptr};
  RMSNorm out_norm{nullptr};  // is_outproj_norm only; applied per head (group = headdim)

 private:
  // The output gate and out_proj: y [B, T, H, R, P] from the scan, z [B, T, H, P].
  torch::Tensor gate(const torch::Tensor& y, const torch::Tensor& z, torch::ScalarType dtype);
  ops::Mamba3StepLayout step_layout() const { return {heads, headdim, groups, d_state, angles, d_inner}; }
  // The fused step where the call fits its kernel (no gradient, no packed documents, the state's layout); undefined
  // where it does not, and the reference step runs.
  std::optional<std::pair<torch::Tensor, ops::Mamba3State>> fused_step(const torch::Tensor& row,
                                                                       const ops::Mamba3State& state,
                                                                       const torch::Tensor& start, bool in_place);
  struct Facts {
    bool cuda;
    c10::ScalarType dtype;
    bool operator==(const Facts&) const = default;
  };
  Mamba3Backend pick(const Facts& facts) const;
  Mamba3Backend backend_;
  std::optional<Facts> picked_for_;
  std::optional<Mamba3Backend> forced_;
};
TORCH_MODULE(Mamba3);

class Mamba3Layer : public Layer {
 public:
  Mamba3Layer(const Recipe& recipe, const torch::TensorOptions& options);
  Family family() const override { return Family::Mamba3; }
  const char* class_name() const override { return "Mamba3Layer"; }
  torch::Tensor forward_normed(const torch::Tensor& h, const Documents* docs = nullptr) override;
  torch::Tensor prefill(const torch::Tensor& x, LayerCache* cache) override;
  std::unique_ptr<LayerCache> make_cache(int64_t batch, int64_t capacity, int64_t max_rollback) const override;

  Mamba3 mamba{nullptr};
};

}  // namespace slm::model
