// The MoE layer's routed experts on CUDA, forward + backward: the per-expert loop (one matmul pair per expert,
// the counts read back to the host) against one grouped GEMM per projection (model::grouped_experts), at
// hybrid-250m's MoE shapes, under BF16 autocast with fp32 master weights as training runs; then the whole layer
// (router, routed and shared experts by the backend the layer picks, model::plan_experts).
//   moe_bench [tokens] [reps] [recipe.json]   (defaults: 16384 = 8 rows of 2048, 20, recipes/hybrid-250m.json)
// TFLOP/s counts the routed GEMMs only: 3 of 2 * tokens * k * d * h flops forward, x3 for forward + backward.
// Without a GPU there is nothing to compare (the CPU always takes the loop): it says so and exits 0.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "median_timer.h"
#include "slm/model/layers/moe.h"
#include "slm/recipe/recipe.h"

namespace {

using slm::bench::median_ms;
using ExpertPath = torch::Tensor (*)(const torch::Tensor&, const slm::model::Routing&, const slm::model::ExpertsImpl&);

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("moe_bench: no CUDA device; the grouped path is for the GPU, nothing to time here\n");
    return 0;
  }
  const int64_t tokens = argc > 1 ? std::stoll(argv[1]) : 16384;
  const int reps = argc > 2 ? std::stoi(argv[2]) : 20;
  const std::string path = argc > 3 ? argv[3] : std::string(SLM_SOURCE_DIR) + "/recipes/hybrid-250m.json";
  const slm::Recipe recipe = slm::load_recipe(path);
  const int64_t d = recipe.d_model, k = recipe.moe->experts_per_token, h = recipe.moe->expert_hidden,
                seq = recipe.seq_len;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::manual_seed(0);
  slm::model::MoE moe(recipe, cuda);
  moe->train();
  // w2 starts at zero (identity residual); random values keep the backward's arithmetic representative.
  {
    torch::NoGradGuard no_grad;
    moe->experts->w2.dense().normal_(0.0, 0.02);
  }
  auto u = torch::randn({tokens, d}, cuda).requires_grad_();
  auto up = torch::randn({tokens, d}, cuda.dtype(torch::kBFloat16));
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, true);

  std::printf("%s MoE: %lld experts top-%lld, d %lld, hidden %lld, %lld tokens, bf16 autocast, %d reps (median)\n",
              recipe.name.c_str(), static_cast<long long>(moe->num_experts), static_cast<long long>(k),
              static_cast<long long>(d), static_cast<long long>(h), static_cast<long long>(tokens), reps);
  const double flops = 3.0 * 3.0 * 2.0 * tokens * k * d * h;
  auto time = [&](ExpertPath f) {
    return median_ms([&] { torch::autograd::backward({f(u, moe->route_tokens(u), *moe->experts)}, {up}); }, reps, true);
  };
  const double loop = time(slm::model::loop_experts), grouped = time(slm::model::grouped_experts);
  torch::Tensor a, b;
  {
    torch::NoGradGuard no_grad;
    auto routing = moe->route_tokens(u);
    a = slm::model::loop_experts(u, routing, *moe->experts).to(torch::kFloat);
    b = slm::model::grouped_experts(u, routing, *moe->experts).to(torch::kFloat);
  }
  std::printf("%-8s %12s %10s\n", "path", "fwd+bwd ms", "TFLOP/s");
  std::printf("%-8s %12.3f %10.1f\n", "loop", loop, flops / loop / 1e9);
  std::printf("%-8s %12.3f %10.1f\n", "grouped", grouped, flops / grouped / 1e9);
  std::printf("loop / grouped: %.2fx; max |grouped - loop| / max |loop| = %.3g\n", loop / grouped,
              (b - a).abs().max().item<double>() / a.abs().max().item<double>());

  auto x = torch::randn({std::max<int64_t>(1, tokens / seq), seq, d}, cuda).requires_grad_();
  auto up3 = torch::randn(x.sizes(), cuda.dtype(torch::kBFloat16));
  const double layer = median_ms([&] { torch::autograd::backward({moe->forward(x)}, {up3}); }, reps, true);
  std::printf("whole layer (%lld x %lld tokens, router + experts backend), fwd+bwd: %.3f ms\n",
              static_cast<long long>(x.size(0)), static_cast<long long>(seq), layer);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  return 0;
}
