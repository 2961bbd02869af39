#pragma once
// A training micro-batch on the device from one pinned host buffer and one asynchronous copy. A copy from pageable
// host memory to the GPU first waits for the stream to drain, and on the H200 machine's host every CPU tensor
// operator costs milliseconds: the step made seven such copies (inputs, targets, the window's document ids and the
// Documents' four tensors) with tensor operators between them, and specialist-small's GPU sat idle for ~25 ms of every
// ~170 ms step (bench/RESULTS.md). Here plain loops fill one pinned buffer, one copy moves it without waiting, and
// the device slices it.
#include <torch/types.h>

#include <optional>

#include "slm/model/documents.h"

namespace slm::train {

struct DeviceBatch {
  torch::Tensor x, y;                    // [rows, T] int64: the inputs and their targets
  torch::Tensor window;                  // [rows, T + 1] int64: each token's document id (HybridLM::loss's window_docs)
  std::optional<model::Documents> docs;  // the documents of the inputs (below)
};

// tokens and doc_ids [rows, T + 1] on the host (data::Batch's: the inputs and the last target) on device. docs:
// with max_documents 0, what documents_from_ids gives (none when every row holds one document); with max_documents
// > 0, a CUDA graph's form (train/graph_step.h): Documents for every batch, cu_seqlens padded to max_documents + 1
// entries (model::padded_starts) and max_len = T, or std::nullopt instead of a batch when it holds more documents.
// Throws slm::Error for tokens that are not int64 [rows, T + 1] with T >= 1, or doc_ids of another shape.
std::optional<DeviceBatch> stage_batch(const torch::Tensor& tokens, const torch::Tensor& doc_ids,
                                       const torch::Device& device, int64_t max_documents = 0);

}  // namespace slm::train
