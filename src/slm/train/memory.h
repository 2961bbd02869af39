#pragma once
// What training holds in device memory, and the message that says what did not fit when an allocation fails
// (docs/training.md, "Out of memory"). Parameters, gradients and optimizer state are exact (from the recipe's
// accounting); activations are an estimate.
#include <cstdint>
#include <exception>
#include <string>

#include "slm/recipe/recipe.h"

namespace slm::train {

struct TrainingMemory {    // bytes; doubles because an estimate for an absurd batch may pass 2^63
  double parameters = 0;   // FP32 master weights of every stored tensor
  double gradients = 0;    // one FP32 gradient per parameter
  double optimizer = 0;    // Muon momentum (one FP32 per matrix element), AdamW moments (two) and step counters
  double activations = 0;  // estimated, one micro-batch: see training_memory
  double total() const { return parameters + gradients + optimizer + activations; }
};

// The memory of training `recipe` on micro-batches of batch x seq_len tokens. The activation estimate counts, per
// token, the input and the output of every matrix the token passes through (saved for the backward: routed experts
// k of N, the LM head's logits twice for the loss), at 2 bytes under BF16 autocast (bf16) or 4; it leaves out
// attention scores and temporaries, so the true peak is higher.
TrainingMemory training_memory(const Recipe& recipe, int64_t batch, int64_t seq_len, bool bf16);

// True for an allocation failure: c10::OutOfMemoryError (CUDA), std::bad_alloc, and the c10::Error of libtorch's
// CPU allocator ("DefaultCPUAllocator: can't allocate memory").
bool is_out_of_memory(const std::exception& e);

struct OutOfMemoryContext {
  std::string where;        // e.g. "at step 12 on cuda:0"
  std::string recipe_file;  // the recipe's file
  int64_t batch = 0;        // sequences per micro-batch on this device
  int64_t seq_len = 0;
  int64_t accum = 1;
  int workers = 1;         // data-parallel processes: --batch is the global batch, batch x workers
  double capacity = 0;     // bytes of memory on the device (0: unknown)
  std::string allocator;   // the allocator's own message, without backtrace
  bool recompute = false;  // activation checkpointing already on (--recompute)
};

// The user's message: each part's size, the allocator's words, and what to change: a --batch that fits the
// capacity with the --accum that keeps the tokens per step, --recompute when it is off, a shorter --seq-len, or a
// smaller recipe.
std::string out_of_memory_message(const TrainingMemory& memory, const OutOfMemoryContext& context);

}  // namespace slm::train
