#pragma once
// The forward and backward of a training micro-batch replayed from one CUDA graph (issue 15). A small model's step
// is thousands of kernels, and between them the GPU waits for the host's launches (specialist-small on an H200: 15%
// of its step in gaps under 100 us, bench/RESULTS.md); captured once, a micro-batch is one launch. The graph reads
// static input buffers (tokens, targets, the window's document ids and the Documents with cu_seqlens padded to a
// fixed count, model/documents.h) and accumulates into gradient buffers that exist before the capture. The
// optimizer, the clip and the metrics stay eager: they are a few multi-tensor launches.
#include <torch/types.h>

#include <memory>
#include <string>

namespace slm::model {
class HybridLM;
}

namespace slm::train {

// "" when model's training step can be captured, else the reason: a CPU model or build, data-parallel workers
// (their gradient hooks reduce during the backward), activation checkpointing, DSA attention (its stages switch
// parameters between trained and frozen).
std::string graph_step_blocker(const model::HybridLM& model, bool distributed, bool recompute);

class GraphStep {
 public:
  // Micro-batches of rows x seq_len tokens for model (which must outlive this), each backward scaled by 1 / accum
  // as the eager step's is. Captures on the first run. Throws slm::Error with graph_step_blocker's reason.
  GraphStep(model::HybridLM& model, int64_t rows, int64_t seq_len, int64_t accum);
  ~GraphStep();
  GraphStep(const GraphStep&) = delete;
  GraphStep& operator=(const GraphStep&) = delete;

  // The eager step's work: BF16 autocast forward of tokens [rows, seq_len + 1] (the inputs and the last target)
  // with the documents of doc_ids [rows, seq_len + 1] (host tensors, data::Batch), then (total / accum).backward()
  // into the parameters' gradients. Returns the main loss, a device scalar that the next run overwrites. The first
  // run, and a batch with more documents than the graph's padded cu_seqlens hold, capture a graph first: one eager
  // warm-up (whose gradients and balance loads are put back) and the capture, which costs about two micro-batches.
  torch::Tensor run(const torch::Tensor& tokens, const torch::Tensor& doc_ids);

  // Zeroes the gradients in place, keeping the buffers the graph accumulates into (Optimizer::zero_grad would drop
  // them).
  void zero_grad();

  // Graphs captured so far (the first, then one per growth of the document capacity).
  int64_t captures() const;
  // Documents a batch may hold without a new capture.
  int64_t document_capacity() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slm::train
