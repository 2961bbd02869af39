#pragma once
// The first Engine: one worker thread per model, one request at a time, through the model's own prefill +
// cached decode loop (engine::generate) on the device the model lives on (CPU or CUDA). Requests wait in a bounded
// FIFO queue.
#include <memory>
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

// The engine owns a share of the model and is its only user while it lives. Throws slm::Error for banned ids
// outside the vocabulary.
std::unique_ptr<Engine> make_decode_engine(std::shared_ptr<model::HybridLM> model, DecodeEngineOptions options);

}  // namespace slm::engine
