#pragma once
// Decode steps replayed from one CUDA graph. A decode step of a small model is hundreds of small kernels whose
// launches cost more than their work (hybrid-250m on an H200: ~1,100 kernels, 2.2 ms of GPU time in ~27 ms of host
// time per token, bench/RESULTS.md); captured once, the step is one launch. The model's own decode runs inside the
// capture: its device-side forms (TokenCache positions, ops::decode_attention, in-place recurrent states, gathered
// or grouped experts) read no host state, so the one graph is right at every position.
#include <torch/types.h>

#include <memory>
#include <string>

namespace slm::model {
class HybridLM;
struct DecodeState;
}  // namespace slm::model

namespace slm::engine {

// "" when a decode step of model on state can be captured, else the reason: a CPU model or build, MLA attention, DSA
// attention in its warm-up stage, an attention head dim without a CUDA decode kernel, Engram tables kept in host
// memory, NVFP4 routed experts with only one projection quantized (their loop reads counts on the host), a state made
// with max_rollback > 0.
std::string graph_decode_blocker(const model::HybridLM& model, const model::DecodeState& state);

class GraphDecoder {
 public:
  // Captures one decode step of model on state (its batch; any position below its capacity). The model and the
  // state must outlive the decoder, and nothing else may decode on the state while it lives (prefill may: the
  // state's buffers keep their addresses). Warms up on a scratch state of the same shape first, so the capture
  // costs that memory for a moment. Throws slm::Error with graph_decode_blocker's reason.
  GraphDecoder(model::HybridLM& model, model::DecodeState& state);
  ~GraphDecoder();
  GraphDecoder(const GraphDecoder&) = delete;
  GraphDecoder& operator=(const GraphDecoder&) = delete;

  // token [B] int64 on the model's device: the same as model.decode(token, state), returning logits [B, V] in a
  // buffer the next step overwrites. Throws slm::Error when the state is full.
  torch::Tensor step(const torch::Tensor& token);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slm::engine
