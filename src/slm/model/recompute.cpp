#include "slm/model/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "slm/util/autocast.h"

namespace slm::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The block and the autocast state it ran under, kept in the autograd context as a capsule.
struct Block : torch::CustomClassHolder {
  BlockFn fn;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
};

class Recompute : public torch::autograd::Function<Recompute> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const c10::intrusive_ptr<Block>& block,
                               const torch::Tensor& anchor) {
    (void)anchor;
    ctx->save_for_backward({x});
    ctx->saved_data["block"] = c10::IValue::make_capsule(block);
    torch::NoGradGuard no_grad;
    return block->fn(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto x = ctx->get_saved_variables()[0];
    auto block = c10::static_intrusive_pointer_cast<Block>(ctx->saved_data["block"].toCapsule());
    // The backward runs on autograd's thread, whose autocast state is its own: the forward's is set for the rerun.
    torch::Tensor dx;
    {
      const AutocastScope as_forward(at::kCUDA, block->autocast, block->autocast_dtype);
      torch::AutoGradMode grad(true);
      auto xd = x.detach().requires_grad_(x.requires_grad());
      auto y = block->fn(xd);
      // Accumulates into every leaf the block reached (its parameters' .grad, their hooks fire) and into xd. Nothing
      // to do when nothing in the block trains (frozen, as in the DSA warm-up).
      if (y.requires_grad()) torch::autograd::backward({y}, {grads[0]});
      dx = xd.requires_grad() ? xd.grad() : torch::Tensor();
    }
    return {dx, {}, {}};
  }
};

}  // namespace

torch::Tensor recompute(const torch::Tensor& x, BlockFn fn) {
  if (!torch::GradMode::is_enabled()) return fn(x);
  auto block = c10::make_intrusive<Block>();
  block->fn = std::move(fn);
  block->autocast = at::autocast::is_autocast_enabled(at::kCUDA);
  block->autocast_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  // The output must require a gradient even when x does not (the first block's input may be a constant), so that
  // the backward reaches the block's parameters: a zero-size tensor that requires grad anchors the node.
  static thread_local torch::Tensor anchor = torch::zeros({0}).requires_grad_(true);
  return Recompute::apply(x, block, anchor);
}

}  // namespace slm::model
