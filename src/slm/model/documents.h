#pragma once
// Documents packed into training rows. The loader fills each row with consecutive documents; every layer family
// starts a document from a clean state, so a document's outputs do not depend on what precedes it in the row:
// attention masks keys of other documents and restarts rotary positions, Mamba-3 and M2RNN reset their state (and
// M2RNN its convolution inputs), Engram n-grams and its convolution do not reach into the previous document, and
// MTP targets stay inside the document of their position. A model given no Documents treats each row as one
// sequence (the inference path, and the training path for rows that hold one document).
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "slm/ops/attention.h"

namespace slm::model {

struct Documents {
  ops::PackedSpans spans;  // id [B, T] int64 (0 for the row's first document, +1 at each start), cu_seqlens, max_len
  at::Tensor pos;          // [B, T] int64: position of each token in its document (the row's first token is at 0)
  at::Tensor start;        // [B, T] bool: a document starts here (pos == 0)
};

// From the loader's ids (data::Batch::doc_ids, or any [B, T] integer ids that change exactly where a document
// starts), on the ids' device. std::nullopt when no row holds a second document: callers then run the unpacked
// path, which is exactly the model without Documents.
std::optional<Documents> documents_from_ids(const at::Tensor& doc_ids);

// How many documents doc_ids holds (each row's first token starts one).
int64_t count_documents(const at::Tensor& doc_ids);

// The host's one pass over document ids [B, T] (any integer type, on the CPU) behind documents_from_ids, for callers
// that lay the result out themselves (the trainer's staged batches, train/device_batch.h): per token, the index of its
// document in its row (id), its position in the document (pos) and whether it starts one (start), B·T entries each;
// per document, its first index in the flattened rows.
struct DocumentScan {
  std::vector<int32_t> starts;
  int64_t max_len = 0;  // the longest document
  bool packed = false;  // some row holds a second document
};
template <class Flag>  // bool or int64_t
DocumentScan scan_documents(const at::Tensor& doc_ids, int64_t* id, int64_t* pos, Flag* start);

// cu_seqlens from a scan of `tokens` tokens: the starts, then `tokens`. With max_documents > 0, the form a CUDA graph
// of the training step reads (train/graph_step.h), whose tensors keep one shape: empty documents pad it to
// max_documents + 1 entries (flash attention's blocks of an empty document return at once), std::nullopt when the
// scan found more.
std::optional<std::vector<int32_t>> padded_starts(const DocumentScan& scan, int64_t tokens, int64_t max_documents);

// The same Documents on another device.
Documents to_device(const Documents& d, const at::Device& device);

// The first n positions (MTP module k runs on positions 0..T-k-1), without the flash boundaries.
Documents narrow_documents(const Documents& d, int64_t n);

}  // namespace slm::model
