#pragma once
// The first Engine: one worker thread per engine, one request at a time, through the model's own prefill + cached
// decode loop (engine::generate, or generate_mixture for a mixture of models) on the device the model lives on (CPU
// or CUDA; decode steps replay a CUDA graph where allowed). Requests wait in a bounded FIFO queue.
#include <memory>
#include <mutex>
#include <vector>

#include "slm/engine/engine.h"

namespace slm::model {
class HybridLM;
}

namespace slm::engine {

struct DecodeEngineOptions {
  std::vector<int64_t> banned_ids;  // never sampled (a tokenizer's control tokens, ids past its vocabulary)
  size_t max_queue = 64;            // waiting requests beyond this are refused with QueueFull
  int64_t context_length = 0;       // 0: the recipe's seq_len
};

// A model as engines share it: a generation holds `in_use` for its whole length, so engines over the same model (a
// specialist's own and the mixtures it takes part in) take turns.
struct EngineModel {
  std::shared_ptr<model::HybridLM> model;
  std::shared_ptr<std::mutex> in_use = std::make_shared<std::mutex>();
};

// The engine owns a share of the model and is its only user while it lives. Throws slm::Error for banned ids
// outside the vocabulary.
std::unique_ptr<Engine> make_decode_engine(std::shared_ptr<model::HybridLM> model, DecodeEngineOptions options);
std::unique_ptr<Engine> make_decode_engine(EngineModel model, DecodeEngineOptions options);

// The token-level mixture of several models of one vocabulary (engine::generate_mixture): each request's
// Request::mixture_weights (one per model, positive; empty: equal) weight the models' next-token distributions.
// The context is the shortest of the models'. Throws slm::Error for fewer than two models or different
// vocabularies.
std::unique_ptr<Engine> make_mixture_engine(std::vector<EngineModel> models, DecodeEngineOptions options);

}  // namespace slm::engine
