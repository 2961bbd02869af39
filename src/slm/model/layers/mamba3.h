#pragma once
// M: a Mamba-3 mixer layer (SISO, or MIMO of rank R), Lahoti et al., "Mamba-3", arXiv 2603.15569. The math
// lives in slm/ops/mamba3_scan.h; this class owns the parameters (names and shapes as in
// recipe/accounting.cpp) and picks the chunked form for sequences and the step form for single tokens.
#include <utility>
#include <vector>

#include "slm/model/layer.h"
#include "slm/model/layers/recurrent_cache.h"
#include "slm/ops/mamba3_scan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

using Mamba3Cache = RecurrentCache<ops::Mamba3State>;

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
