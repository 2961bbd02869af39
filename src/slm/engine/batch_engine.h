#pragma once
// Continuous batching: a fixed number of sequence slots over one model, decoded together. Requests join and leave
// between steps; a prompt goes in by chunks of its own prefill (on a private state, then copied into a free row of
// the pool), with a decode step of the running slots between chunks, so a long prompt does not stall the others.
// Running sequences occupy the leading rows of a pooled decode state; each row attends, rotates and writes at its
// own length (the state's device positions), and a step runs on the leading rows only (a view of the pool, rounded
// up to a power of two where a CUDA graph per size replays it). A finished row is replaced by the last running row.
// Every request samples from its own seeded generator, so what it gets does not depend on its neighbours.
#include <functional>
#include <memory>
#include <string>

#include "slm/engine/decode_engine.h"

namespace at {
class Tensor;
}
namespace slm::model {
class HybridLM;
}

namespace slm::engine {

// "" when every row of a decode state of model can decode at its own length, else why not (MLA, and DSA in its
// warm-up stage: their attention reads the cache by the host's length).
std::string batch_decode_blocker(const model::HybridLM& model);

// For tests: called on the engine's thread with a request's next-token logits once its whole prompt is in
// ([1, V] on the model's device, before the banned ids are masked), whether prefilled or restored from the cache.
using PromptLogitsHook = std::function<void(RequestId id, const at::Tensor& logits)>;

// options.slots (>= 1) sequences at once, options.prefill_chunk (>= 1) prompt tokens per prefill step. Throws
// slm::Error with batch_decode_blocker's reason, or for banned ids outside the vocabulary.
std::unique_ptr<Engine> make_batch_engine(EngineModel model, DecodeEngineOptions options,
                                          PromptLogitsHook on_prompt_logits = {});

}  // namespace slm::engine
