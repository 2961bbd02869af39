#pragma once
// Picks the next token from logits: greedy, or sampling with temperature, top-k and top-p (nucleus), after the
// repetition, presence and frequency penalties. The arithmetic runs on the logits' device for a whole batch of rows
// at once (no copy of the logits to the host, one read of the chosen ids); the randomness is one uniform number per
// row and token from the sequence's own seeded generator on the host, so a fixed seed reproduces the same tokens
// whatever other sequences share the batch.
//
// The draw is an inverse CDF in vocabulary order: the first id whose cumulative probability exceeds u times the
// total. The penalties follow vLLM (and OpenAI's definitions of presence and frequency):
//   repetition r:  a logit l of an id seen in the prompt or the output becomes l / r if l > 0, else l * r;
//   then          l -= frequency * (times the id was generated) + presence * (1 if it was generated at all).
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace slm::model {

struct SamplerOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // 1: no limit
  uint64_t seed = 0;
  double repetition_penalty = 1.0;  // > 0; 1: none
  double presence_penalty = 0.0;    // [-2, 2]; 0: none
  double frequency_penalty = 0.0;   // [-2, 2]; 0: none
  bool penalized() const { return repetition_penalty != 1.0 || presence_penalty != 0.0 || frequency_penalty != 0.0; }
};

// The per-row pieces, usable on their own: logits [B, V] on any device, rows[r] the options of row r; no read of
// the device.

// The penalties of rows[r] on row r: generated [B, V] (how often each id was generated, any number type) and
// prompt [B, V] (bool, the ids in the prompt). Returns new float logits.
at::Tensor apply_penalties(const at::Tensor& logits, const at::Tensor& generated, const at::Tensor& prompt,
                           const std::vector<SamplerOptions>& rows);
// The distribution a row draws from, [B, V] double, after temperature (> 0), top_k and top_p. Top-k keeps every id
// tied with the k-th largest logit; top-p keeps the most likely ids while the mass before them is below top_p (and
// every id tied with the last one kept).
at::Tensor filtered_probabilities(const at::Tensor& logits, const std::vector<SamplerOptions>& rows);
// One id per row from weights [B, V] (non-negative, a positive sum): the first id whose running sum exceeds
// uniform[r] (in [0, 1)) times the row's sum.
at::Tensor inverse_cdf(const at::Tensor& weights, const std::vector<double>& uniform);

class Sampler {
 public:
  // Throws slm::Error for a negative temperature or top_k, top_p outside (0, 1], a repetition penalty <= 0, or a
  // presence or frequency penalty outside [-2, 2].
  explicit Sampler(const SamplerOptions& options);
  const SamplerOptions& options() const { return options_; }
  bool greedy() const { return options_.temperature == 0.0; }

  // The prompt the repetition penalty counts; call before the first sample (a no-op without penalties).
  void set_prompt(const std::vector<int64_t>& prompt);
  // logits [B, V] (any device, any float dtype) -> token ids [B] int64 on the logits' device. With penalties,
  // every row is the same sequence's continuation (B = 1 in practice) and the ids drawn are counted.
  at::Tensor sample(const at::Tensor& logits);
  // Row r of logits [B, V] by samplers[r]; returns the ids on the host (the one read of the device).
  static std::vector<int64_t> sample_rows(const std::vector<Sampler*>& samplers, const at::Tensor& logits);

  // What speculative sampling (engine/generation.h) uses on its own (a sampler without penalties):
  // the distribution sample() draws from when not greedy, logits [B, V] -> [B, V] double on the CPU;
  at::Tensor probabilities(const at::Tensor& logits) const;
  // one id per row from weights [B, V] (on the CPU, non-negative, a positive sum) -> ids [B] on the CPU;
  at::Tensor draw(const at::Tensor& weights);
  // a uniform number in [0, 1) from the same generator.
  double uniform();

 private:
  // The counts of generated ids and the prompt's ids [rows, V] on logits' device, made at the first sample.
  void track(const at::Tensor& logits);
  void count(const at::Tensor& ids);

  SamplerOptions options_;
  at::Generator generator_;
  std::vector<int64_t> prompt_;
  at::Tensor generated_, prompt_seen_;
};

}  // namespace slm::model
