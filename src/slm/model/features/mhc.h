#pragma once
// mHC, manifold-constrained hyper-connections (arXiv 2512.24880 §4.2). The residual stream
// is n streams X [B, T, n, D], all copies of the embedding at the start. A layer with a learned mix reads
// u = Σ_i H_pre[i]·X[i], runs its block y = F(u) and writes X'[j] = H_post[j]·y + Σ_i H_res[j,i]·X[i], with
//   [h_pre; h_post; h_res] = α ⊙ (RMSNorm(vec X) φᵀ) + b        (φ: [n²+2n, n·D], fused order pre, post, res)
//   H_pre = σ(h_pre),  H_post = 2σ(h_post),  H_res = SinkhornKnopp(h_res / temperature).
// Layers without a learned mix use the fixed plain-residual mix (u = mean of the streams, X'[j] = X[j] + y).
// blend_alpha β blends every learned coefficient with the plain mix: H = (1-β)·H_plain + β·H_learned.
// The head collapses the streams before the final norm: h = Σ_i σ(α·(RMSNorm(vec X) φ_headᵀ) + b)[i]·X[i].
//
// Initialisation makes the model a plain residual network: φ = 0 (so the mix is the biases alone), H_post = 1,
// H_res = J/n (rows sum to 1), H_pre sums to 1 and the head averages the streams; identical streams then stay
// identical and each layer sees exactly x. H_pre leans on stream (layer mod n) so the streams' gradients differ from
// the first step (with a symmetric start every stream would receive the same update forever).
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "slm/ops/residual_mix.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

// Sinkhorn-Knopp projection of logits [..., n, n] (already divided by the temperature) onto the doubly
// stochastic matrices: M = exp(logits - max), then iters × (columns to sum 1, rows to sum 1), each division
// guarded by + eps. Rows (output streams) end exact; the columns converge with iters. Computed in at least float32.
torch::Tensor sinkhorn(const torch::Tensor& logits, int iters, double eps);

struct MhcCoefficients {
  torch::Tensor pre;   // [..., n]
  torch::Tensor post;  // [..., n]
  torch::Tensor res;   // [..., n, n], res[j, i]: weight of input stream i in output stream j
};

// u = Σ_i pre[i]·X[i]: X [..., n, D], pre [..., n] -> [..., D].
torch::Tensor mhc_read(const torch::Tensor& streams, const torch::Tensor& pre);
// X'[j] = post[j]·y + Σ_i res[j, i]·X[i].
torch::Tensor mhc_write(const torch::Tensor& streams, const torch::Tensor& y, const MhcCoefficients& c);

// The learned mix of one layer ("layers.{i}.mhc": phi, bias, alpha).
class MhcMixImpl : public torch::nn::Module {
 public:
  // layer: the layer's index (picks the stream its H_pre leans on at initialisation).
  MhcMixImpl(const Recipe& recipe, int layer, const torch::TensorOptions& options);
  // Coefficients for streams X [B, T, n, D], blended with the plain mix by blend_alpha.
  MhcCoefficients coefficients(const torch::Tensor& streams) const;
  // One layer: X' from X and the layer's block F ([B, T, D] -> [B, T, D]).
  template <class Block>
  torch::Tensor forward(const torch::Tensor& streams, Block&& block) const {
    auto c = coefficients(streams);
    return mhc_write(streams, block(mhc_read(streams, c.pre)), c);
  }

  torch::Tensor phi, bias, alpha;  // [n²+2n, n·D], [n²+2n], [3] (α_pre, α_post, α_res)
  int64_t n;
  int iters;
  double temperature, epsilon, blend, norm_eps;
};
TORCH_MODULE(MhcMix);

// Collapses the streams before the final norm ("mhc_head": phi [n, n·D], bias [n], alpha [1]).
class MhcHeadImpl : public torch::nn::Module {
 public:
  MhcHeadImpl(const Recipe& recipe, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& streams) const;  // [B, T, n, D] -> [B, T, D]

  torch::Tensor phi, bias, alpha;
  int64_t n;
  double blend, norm_eps;
};
TORCH_MODULE(MhcHead);

// The fixed plain-residual mix: X' = X + y on every stream, the block reading the mean of the streams. mean: the
// streams' mean when the plain mix before left it (else computed here); on return X''s mean, where the fused kernel
// computes it along with X' (inference on CUDA: one launch per plain layer instead of a mean and a broadcast add),
// else undefined.
template <class Block>
torch::Tensor mhc_plain(const torch::Tensor& streams, Block&& block, torch::Tensor& mean) {
  const auto y = block(mean.defined() ? mean : streams.mean(-2));
  if (ops::stream_add_mean_fusable(streams, y)) {
    auto [out, next] = ops::stream_add_mean(streams, y);
    mean = next;
    return out;
  }
  mean = torch::Tensor();
  return streams + y.unsqueeze(-2);
}

}  // namespace slm::model
