#pragma once
// Small building blocks shared by every layer family. Parameters are created directly with the caller's
// TensorOptions so a model can be built in float64 (gradient checks) or on the meta device (no allocation).
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "slm/model/weight.h"

namespace slm::model {

// Bias-free linear map; weight is [out, in] (PyTorch layout), registered as "weight", dense or NVFP4 (weight.h).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x) { return weight.linear(x); }
  Weight weight;
};
TORCH_MODULE(Linear);

// Token embedding table "weight" [vocab, d_model], N(0, 1) init.
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t vocab, int64_t dim, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor weight;
};
TORCH_MODULE(Embedding);

// RMSNorm over the last dim with a learned gain "weight" (init 1).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// SwiGLU MLP: w2(silu(gate) * up) with [gate; up] = w13(x). Rows [0, hidden) of w13 are the gate, rows
// [hidden, 2*hidden) the up projection; routed experts use the same convention.
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t d_model, int64_t hidden, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  Linear w13{nullptr};
  Linear w2{nullptr};
};
TORCH_MODULE(SwiGLU);

// silu(h[..., :f]) * h[..., f:] for h = [gate; up] of width 2f.
torch::Tensor swiglu_activation(const torch::Tensor& h);

// Uniform init with the variance of N(0, 1/fan_in), as nanochat does for input projections.
void init_fan_in_uniform(torch::Tensor& w, int64_t fan_in, double gain = 1.0);

}  // namespace slm::model
