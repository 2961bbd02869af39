#include "slm/train/device_batch.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::train {

std::optional<DeviceBatch> stage_batch(const torch::Tensor& tokens, const torch::Tensor& doc_ids,
                                       const torch::Device& device, int64_t max_documents) {
  if (!tokens.defined() || tokens.dim() != 2 || tokens.scalar_type() != at::kLong || tokens.size(1) < 2 ||
      !tokens.is_cpu())
    throw Error("training batch: tokens must be int64 [rows, T + 1] on the host, got " + shape_text(tokens));
  if (!doc_ids.defined() || doc_ids.sizes() != tokens.sizes() || !doc_ids.is_cpu())
    throw Error("training batch: document ids must be [rows, T + 1] like the tokens " + shape_text(tokens) + ", got " +
                shape_text(doc_ids));
  const int64_t rows = tokens.size(0), w = tokens.size(1), t = w - 1, n = rows * t;
  // One int64 buffer: x and y [n], the window's ids [rows * w], the documents' id, pos and start [n] each, cu_seqlens.
  const int64_t window_at = 2 * n, id_at = window_at + rows * w, pos_at = id_at + n, start_at = pos_at + n,
                cu_at = start_at + n;
  const int64_t cu_room = (max_documents > 0 ? max_documents : n) + 1;
  auto host = at::empty({cu_at + cu_room}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  int64_t* p = host.data_ptr<int64_t>();
  const auto tok = tokens.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < t; ++i) p[r * t + i] = tok[r][i], p[n + r * t + i] = tok[r][i + 1];
  AT_DISPATCH_INTEGRAL_TYPES(doc_ids.scalar_type(), "stage_batch", [&] {
    const auto ids = doc_ids.accessor<scalar_t, 2>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < w; ++i) p[window_at + r * w + i] = static_cast<int64_t>(ids[r][i]);
  });
  const model::DocumentScan scan = model::scan_documents(doc_ids.narrow(1, 0, t), p + id_at, p + pos_at, p + start_at);
  const bool with_docs = max_documents > 0 || scan.packed;
  std::optional<std::vector<int32_t>> cu;
  if (with_docs) {
    cu = model::padded_starts(scan, n, max_documents);
    if (!cu) return std::nullopt;
    for (size_t i = 0; i < cu->size(); ++i) p[cu_at + static_cast<int64_t>(i)] = (*cu)[i];
  }
  const int64_t used = with_docs ? cu_at + static_cast<int64_t>(cu->size()) : id_at;
  const auto dev = host.narrow(0, 0, used).to(device, at::kLong, /*non_blocking=*/true);
  auto part = [&](int64_t at, int64_t cols) { return dev.narrow(0, at, rows * cols).view({rows, cols}); };
  DeviceBatch b;
  b.x = part(0, t);
  b.y = part(n, t);
  b.window = part(window_at, w);
  if (with_docs) {
    model::Documents d;
    d.spans.id = part(id_at, t);
    d.pos = part(pos_at, t);
    d.start = part(start_at, t).to(at::kBool);
    d.spans.cu_seqlens = dev.narrow(0, cu_at, static_cast<int64_t>(cu->size())).to(at::kInt);
    d.spans.max_len = max_documents > 0 ? t : scan.max_len;
    b.docs = std::move(d);
  }
  return b;
}

}  // namespace slm::train
