#pragma once
// Engines over the model's own prefill + cached decode: one worker thread per engine on the device the model lives on
// (CPU or CUDA; decode steps replay a CUDA graph where allowed), requests waiting in a bounded FIFO queue. Either
// continuous batching (batch_engine.h) or one request at a time through engine::generate (generate_mixture for a
// mixture of models, and for models whose rows cannot decode at different lengths).
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
  int64_t slots = 8;                // sequences generated at once (continuous batching, batch_engine.h)
  int64_t prefill_chunk = 512;      // prompt tokens per prefill step; the running sequences step between chunks
  bool cuda_graph = true;           // replay decode steps from CUDA graphs where graph_decode_blocker allows
  // Continuous batching keeps the states of recent prompts (at every prefill_chunk boundary and at the end) for
  // later prompts that start with the same tokens, up to this many bytes of state memory in all (DecodeState::bytes:
  // the KV caches and the recurrent states; least recently used go first; 0: off).
  int64_t prefix_cache_bytes = int64_t{512} << 20;
};

// A model as engines share it: a generation holds `in_use` for its whole length, so engines over the same model (a
// specialist's own and the mixtures it takes part in) take turns.
struct EngineModel {
  std::shared_ptr<model::HybridLM> model;
  std::shared_ptr<std::mutex> in_use = std::make_shared<std::mutex>();
};

// The engine owns a share of the model and is its only user while it lives: the continuous-batching engine
// (batch_engine.h) when the model allows it (batch_decode_blocker), else one request at a time.
// Throws slm::Error for banned ids outside the vocabulary.
std::unique_ptr<Engine> make_decode_engine(std::shared_ptr<model::HybridLM> model, DecodeEngineOptions options);
std::unique_ptr<Engine> make_decode_engine(EngineModel model, DecodeEngineOptions options);

// The token-level mixture of several models of one vocabulary (engine::generate_mixture): each request's
// Request::mixture_weights (one per model, positive; empty: equal) weight the models' next-token distributions.
// The context is the shortest of the models'. Throws slm::Error for fewer than two models or different
// vocabularies.
std::unique_ptr<Engine> make_mixture_engine(std::vector<EngineModel> models, DecodeEngineOptions options);

}  // namespace slm::engine
