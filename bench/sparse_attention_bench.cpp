// DSA's main attention: ops::sparse_attention (both executions) against dense causal SDPA, forward and
// forward + backward, for NAM56R-like GQA (32 query heads, 8 KV heads of 128) and MLA's absorbed MQA form
// (32 heads over one 576-dim key / 512-dim value), k = max(T/2, 128) keys per query as the recipes set it.
//   sparse_attention_bench [tokens] [device] [dtype]   (defaults: 4096, cuda when available, bf16 on cuda)
// Prints the median milliseconds of each and the max difference of the sparse outputs from each other; then one
// decode step (the last query against every key) masked, gathered and dense.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "median_timer.h"
#include "slm/model/layers/dsa_indexer.h"
#include "slm/ops/attention.h"
#include "slm/ops/sparse_attention.h"

namespace {

using slm::bench::median_ms;

struct Case {
  const char* name;
  int64_t heads, kv, dk, dv;
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t t = argc > 1 ? std::stoll(argv[1]) : 4096;
  const bool cuda = argc > 2 ? std::string(argv[2]) == "cuda" : torch::cuda::is_available();
  const bool bf16 = argc > 3 ? std::string(argv[3]) == "bf16" : cuda;
  const auto opts =
      torch::TensorOptions().device(cuda ? torch::kCUDA : torch::kCPU).dtype(bf16 ? torch::kBFloat16 : torch::kFloat);
  const int reps = cuda ? 5 : 3;
  torch::manual_seed(0);
  // A random selection with the DSA shape: the local window plus random earlier keys, k(p) per query.
  auto scores = torch::randn({1, t, t}, opts.dtype(torch::kFloat));
  auto index = slm::model::dsa_select(scores, 0.5, 128, 0);
  std::printf("tokens %lld, %s %s, keys per query up to %lld\n", static_cast<long long>(t), cuda ? "cuda" : "cpu",
              bf16 ? "bf16" : "fp32", static_cast<long long>(index.size(2)));
  std::printf("%-10s %-9s %10s %10s %14s\n", "layout", "path", "fwd ms", "fwd+bwd ms", "max |diff|");
  for (const Case& c : {Case{"gqa", 32, 8, 128, 128}, Case{"mla-mqa", 32, 1, 576, 512}}) {
    auto q = torch::randn({1, c.heads, t, c.dk}, opts).requires_grad_(true);
    auto k = torch::randn({1, c.kv, t, c.dk}, opts).requires_grad_(true);
    auto v = torch::randn({1, c.kv, t, c.dv}, opts).requires_grad_(true);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
    auto grad_out = torch::randn({1, c.heads, t, c.dv}, opts);
    auto run = [&](const std::function<torch::Tensor()>& f, const char* path, const torch::Tensor& ref) {
      torch::Tensor out;
      const double fwd = median_ms(
          [&] {
            torch::NoGradGuard no_grad;
            out = f();
          },
          reps, cuda);
      const double both = median_ms([&] { torch::autograd::backward({f()}, {grad_out}); }, reps, cuda);
      const double diff =
          ref.defined() ? (out.to(torch::kFloat) - ref.to(torch::kFloat)).abs().max().item<double>() : 0;
      std::printf("%-10s %-9s %10.2f %10.2f %14.3g\n", c.name, path, fwd, both, diff);
      return out;
    };
    run([&] { return slm::ops::causal_attention(q, k, v, 0, scale); }, "dense", {});
    auto masked =
        run([&] { return slm::ops::sparse_attention(q, k, v, index, scale, false, slm::ops::SparsePath::Masked).out; },
            "masked", {});
    run([&] { return slm::ops::sparse_attention(q, k, v, index, scale, false, slm::ops::SparsePath::Gather).out; },
        "gather", masked);
    // One decode step: the last query against the whole cache.
    torch::NoGradGuard no_grad;
    auto q1 = q.detach().narrow(2, t - 1, 1), k1 = k.detach(), v1 = v.detach();
    auto last = index.narrow(1, t - 1, 1);
    for (auto path : {slm::ops::SparsePath::Masked, slm::ops::SparsePath::Gather}) {
      const double ms = median_ms([&] { slm::ops::sparse_attention(q1, k1, v1, last, scale, false, path); }, 21, cuda);
      std::printf("%-10s %-9s %10.3f %10s\n", c.name, path == slm::ops::SparsePath::Gather ? "decode-g" : "decode-m",
                  ms, "-");
    }
    const double dense_ms = median_ms([&] { slm::ops::causal_attention(q1, k1, v1, 0, scale); }, 21, cuda);
    std::printf("%-10s %-9s %10.3f %10s\n", c.name, "decode-d", dense_ms, "-");
  }
  return 0;
}
