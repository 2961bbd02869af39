#pragma once
// Picks the next token from logits: greedy, or sampling with temperature, top-k and top-p (nucleus), from
// a private seeded generator so a fixed seed reproduces the same tokens.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slm::model {

struct SamplerOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // 1: no limit
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws slm::Error for a negative temperature or top_k, or top_p outside (0, 1].
  explicit Sampler(const SamplerOptions& options);
  // logits [B, V] (any device, any float dtype) -> token ids [B] int64 on the logits' device.
  at::Tensor sample(const at::Tensor& logits);

  // The pieces of sample() that speculative sampling (engine/generation.h) uses on their own:
  bool greedy() const { return options_.temperature == 0.0; }
  // The distribution sample() draws from when not greedy: logits [B, V] -> probabilities [B, V], double, on the CPU,
  // after temperature, top-k and top-p.
  at::Tensor probabilities(const at::Tensor& logits) const;
  // One id per row from weights [B, V] (double on the CPU, non-negative, any positive sum) -> ids [B] on the CPU.
  at::Tensor draw(const at::Tensor& weights);
  // A uniform number in [0, 1) from the same generator.
  double uniform();

 private:
  SamplerOptions options_;
  at::Generator generator_;
};

}  // namespace slm::model
