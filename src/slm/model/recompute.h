#pragma once
// Activation checkpointing (issue 15: full-size NAM56R must fit one GPU's memory): a block runs once in the forward
// without keeping its intermediate tensors, and again in the backward, where its gradients are taken from the
// recomputed graph. Memory per block falls to its input; compute rises by one forward of the block.
#include <torch/torch.h>

#include <functional>

namespace slm::model {

using BlockFn = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(x) with fn's intermediates dropped and recomputed in the backward. fn must be a pure function of x and of
// parameters (leaf tensors, whose gradients are accumulated into .grad as usual): no side effects, no randomness,
// and whatever it captures must stay valid until the backward (capture by value). BF16 autocast, when on, is on
// for the recomputation too. Without grad mode, or when neither x nor a parameter needs a gradient, it is fn(x).
torch::Tensor recompute(const torch::Tensor& x, BlockFn fn);

}  // namespace slm::model
