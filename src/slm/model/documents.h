#pragma once
// Documents packed into training rows. The loader fills each row with consecutive documents; every layer family
// starts a document from a clean state, so a document's outputs do not depend on what precedes it in the row:
// attention masks keys of other documents and restarts rotary positions, Mamba-3 and M2RNN reset their state (and
// M2RNN its convolution inputs), Engram n-grams and its convolution do not reach into the previous document, and
// MTP targets stay inside the document of their position. A model given no Documents treats each row as one
// sequence (the inference path, and the training path for rows that hold one document).
#include <ATen/core/Tensor.h>

#include <optional>

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

// The same Documents on another device.
Documents to_device(const Documents& d, const at::Device& device);

// The first n positions (MTP module k runs on positions 0..T-k-1), without the flash boundaries.
Documents narrow_documents(const Documents& d, int64_t n);

}  // namespace slm::model
