#pragma once
// Completions from an in-process model: the recipe's HybridLM with a checkpoint's weights, prompted with each problem
// and decoded by engine::generate_text (the code tokenizer) or generate_byte_text (byte-level), as `slm generate`.
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "slm/data/tokenizer.h"
#include "slm/eval/completions.h"
#include "slm/model/hybrid_lm.h"

namespace slm::eval {

struct ModelSpec {
  std::string checkpoint;  // training checkpoint, run directory (its latest), or weights file; "": random weights
  std::string recipe;      // recipe file; "": the training checkpoint's own (its meta.json)
  std::string tokenizer;   // .model file or "byte"; "": the one the checkpoint was trained with, else byte-level
  std::string device = "cpu";
  int64_t max_tokens = 256;
  double temperature = 0;  // 0: greedy
  double top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;  // sample j of a problem uses a seed from (seed, problem name, j): any subset reproduces
};

class ModelCompletions : public CompletionSource {
 public:
  // Loads the model; throws slm::Error naming the file at fault.
  explicit ModelCompletions(ModelSpec spec);
  std::string describe() const override { return description_; }
  int count(const Problem&, int n) const override { return n; }
  std::vector<std::string> complete(const Problem& problem, int n) override;

 private:
  ModelSpec spec_;
  std::string description_;
  std::unique_ptr<model::HybridLM> model_;
  std::optional<data::Tokenizer> tokenizer_;  // none: byte-level
};

}  // namespace slm::eval
