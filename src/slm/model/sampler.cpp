#include "slm/model/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <limits>

#include "slm/util/error.h"

namespace slm::model {

Sampler::Sampler(const SamplerOptions& options)
    : options_(options), generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {
  if (options.temperature < 0) throw Error("sampler: temperature must be >= 0");
  if (options.top_k < 0) throw Error("sampler: top_k must be >= 0");
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) throw Error("sampler: top_p must be in (0, 1]");
}

at::Tensor Sampler::sample(const at::Tensor& logits) {
  if (logits.dim() != 2) throw Error("sampler: expected logits [batch, vocab]");
  if (greedy()) return logits.argmax(-1);
  return draw(probabilities(logits)).to(logits.device());
}

at::Tensor Sampler::probabilities(const at::Tensor& logits) const {
  if (logits.dim() != 2) throw Error("sampler: expected logits [batch, vocab]");
  if (greedy()) throw Error("sampler: a greedy sampler has no distribution to draw from");
  // The draw happens on the CPU so one generator serves every device and the seed fixes the result.
  auto z = logits.detach().to(torch::kCPU, torch::kDouble) / options_.temperature;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (options_.top_k > 0 && options_.top_k < z.size(1)) {
    auto kth = std::get<0>(z.topk(options_.top_k, -1)).narrow(1, options_.top_k - 1, 1);
    z = z.masked_fill(z < kth, neg_inf);
  }
  if (options_.top_p < 1.0) {
    auto [sorted, order] = z.sort(-1, /*descending=*/true);
    auto cum = torch::softmax(sorted, -1).cumsum(-1);
    // Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
    auto drop_sorted = (cum - torch::softmax(sorted, -1)) >= options_.top_p;
    auto drop = torch::zeros_like(drop_sorted).scatter(1, order, drop_sorted);
    z = z.masked_fill(drop, neg_inf);
  }
  return torch::softmax(z, -1);
}

at::Tensor Sampler::draw(const at::Tensor& weights) {
  return at::multinomial(weights, 1, false, generator_).squeeze(1);
}

double Sampler::uniform() {
  return at::empty({1}, at::kDouble).uniform_(0.0, 1.0, generator_).item<double>();
}

}  // namespace slm::model
