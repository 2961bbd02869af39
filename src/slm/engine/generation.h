#pragma once
// Autoregressive generation with the decode state: prefill the prompt once, then one cached decode step per
// token, replayed from a CUDA graph where the model allows it (graph_decoder.h). The one loop behind `slm generate`,
// `slm demo`, the first Engine and the in-process evaluation.
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "slm/model/hybrid_lm.h"
#include "slm/model/sampler.h"

namespace slm::engine {

struct GenerationOptions {
  int64_t max_tokens = 64;
  model::SamplerOptions sampling;
  torch::Tensor banned;  // [V] bool: ids never sampled (e.g. BOS, PAD, ids past the tokenizer); may be undefined
  int64_t stop_id = -1;  // generation ends after this id is produced (-1: never)
  // Text generation (text::generate_text, text::generate_byte_text) ends once the generated text contains one of
  // these (e.g. a benchmark's "\n}"); the text is returned whole, the caller cuts it. The ids paths ignore them.
  std::vector<std::string> stop_texts;
  // Decode steps replay a CUDA graph when graph_decode_blocker allows (CUDA models without MLA, DSA warm-up
  // or host-resident Engram tables); false: always the eager step.
  bool cuda_graph = true;
  // Speculative decoding of one model (generate() and the text paths): each step the MTP modules draft this many
  // tokens after the next one, one forward judges them all, the longest agreeing prefix is kept and the state
  // rolls back over the rest. 0: off; at most the recipe's MTP depth. Greedy output is the same as without;
  // sampling keeps each draft d with probability p(d) and otherwise draws from p without d (the draft is a point
  // mass, so this is speculative sampling: the tokens have exactly the sampler's distribution), though a seed gives
  // other tokens than without. Runs eagerly (no CUDA graph).
  int64_t speculative = 0;
};

// Where a generation's time went (wall clock, the callbacks excluded). The first token comes out of the prompt's
// prefill; every later one costs a decode step. Sampling, which reads each id back to the host, is included.
struct GenerationStats {
  int64_t prompt_tokens = 0;
  double prefill_s = 0;      // prefill of the prompt and the first token's sampling
  int64_t decode_steps = 0;  // tokens after the first
  double decode_s = 0;
  bool graph = false;    // the decode steps replayed a CUDA graph (its capture is in prefill_s)
  int64_t drafted = 0;   // speculative: drafts judged by the main model
  int64_t accepted = 0;  // speculative: drafts kept (acceptance rate = accepted / drafted)
};

// prompt: at least one id. on_token (optional) sees each new id as it is produced; returning false stops.
// Returns the generated ids (the prompt excluded). stats (optional) receives the timings. Throws slm::Error for
// options.speculative beyond the recipe's MTP depth.
std::vector<int64_t> generate(model::HybridLM& model, const std::vector<int64_t>& prompt,
                              const GenerationOptions& options, const std::function<bool(int64_t)>& on_token = {},
                              GenerationStats* stats = nullptr);

// Several models of one vocabulary decoding in lockstep, the next token drawn from the mixture of their next-token
// distributions, p = Σ w_i softmax(logits_i) with the weights normalised to sum 1 (the sampler's temperature, top-k
// and top-p apply to log p). Each model keeps its own state (and CUDA graph). A single member is generate() without
// speculation. Throws slm::Error for no members, different vocabularies, a weight that is not positive or
// options.speculative (one model's drafts).
struct MixtureMember {
  model::HybridLM* model = nullptr;
  double weight = 1.0;
};
std::vector<int64_t> generate_mixture(const std::vector<MixtureMember>& members, const std::vector<int64_t>& prompt,
                                      const GenerationOptions& options,
                                      const std::function<bool(int64_t)>& on_token = {},
                                      GenerationStats* stats = nullptr);

}  // namespace slm::engine
