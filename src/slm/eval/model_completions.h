#pragma once
// Completions from an in-process model: the recipe's HybridLM with a checkpoint's weights, prompted with each problem
// as `slm generate` prompts it (text::text_ids) and decoded by the engine (decode_engine.h): continuous batching
// of up to `slots` sequences, the samples of a problem and of the problems after it together, on CPU or CUDA. Every
// sample draws from its own seeded generator, so what it gets does not depend on its neighbours: greedy completions
// are text::generate_text's, sampled ones repeat from the seed.
#include <memory>
#include <optional>
#include <string>

#include "slm/data/tokenizer.h"
#include "slm/engine/decode_engine.h"
#include "slm/eval/completions.h"
#include "slm/model/hybrid_lm.h"
#include "slm/text/text_generation.h"

namespace slm::eval {

struct ModelSpec {
  std::string checkpoint;  // training checkpoint, run directory (its latest), or weights file; "": random weights
  std::string recipe;      // recipe file; "": the training checkpoint's own (its meta.json)
  std::string tokenizer;   // .model file or "byte"; "": the one the checkpoint was trained with, else byte-level
  std::string device = "cpu";
  int slots = 32;         // sequences generated at once
  SamplingSpec sampling;  // its seed also seeds random weights
};

class ModelCompletions : public CompletionSource {
 public:
  // Loads the model; throws slm::Error naming the file at fault.
  explicit ModelCompletions(ModelSpec spec);
  // A model already built (tests); tokenizer: none for byte-level. spec's checkpoint, recipe, tokenizer and device
  // are not read.
  ModelCompletions(std::shared_ptr<model::HybridLM> model, std::optional<data::Tokenizer> tokenizer, ModelSpec spec);
  ~ModelCompletions() override;
  std::string describe() const override { return description_; }
  int count(const Problem&, int n) const override { return n; }
  using CompletionSource::complete;
  void complete(const std::vector<Problem>& problems, int n, const DeliverFn& deliver) override;

 private:
  // The engine, (re)made with a context that holds `context` tokens (a prompt past the recipe's seq_len still runs,
  // as with `slm generate`).
  engine::Engine& engine_for(int64_t context);
  const data::Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  // The banned ids, EOS and the description (weights, tokenizer: what they are).
  void start(const std::string& weights, const std::string& tokenizer_name);
  // Sample j of the problem: its text, after submitting prompt to eng and waiting for the end.
  std::string generate(engine::Engine& eng, const std::vector<int64_t>& prompt, const Problem& problem, int j);

  ModelSpec spec_;
  std::string description_;
  std::shared_ptr<model::HybridLM> model_;
  std::optional<data::Tokenizer> tokenizer_;  // none: byte-level
  std::vector<int64_t> banned_;
  int64_t eos_ = 0;
  std::unique_ptr<engine::Engine> engine_;
};

}  // namespace slm::eval
