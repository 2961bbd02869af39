#include "slm/model/documents.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <vector>

#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

template <class Flag>
DocumentScan scan_documents(const at::Tensor& doc_ids, int64_t* id, int64_t* pos, Flag* start) {
  const int64_t b = doc_ids.size(0), t = doc_ids.size(1);
  DocumentScan scan;
  // The ids in their own integer type, read through their strides (no conversion or contiguous copy).
  AT_DISPATCH_INTEGRAL_TYPES(doc_ids.scalar_type(), "scan_documents", [&] {
    const auto acc = doc_ids.accessor<scalar_t, 2>();
    for (int64_t r = 0; r < b; ++r) {
      int64_t doc = 0, at = 0;
      for (int64_t i = 0; i < t; ++i) {
        const bool first = i == 0 || acc[r][i] != acc[r][i - 1];
        scan.packed = scan.packed || (first && i > 0);
        if (first) {
          if (i > 0) ++doc;
          at = 0;
          scan.starts.push_back(static_cast<int32_t>(r * t + i));
        }
        const int64_t k = r * t + i;
        start[k] = static_cast<Flag>(first), id[k] = doc, pos[k] = at++;
        scan.max_len = std::max(scan.max_len, at);
      }
    }
  });
  return scan;
}
template DocumentScan scan_documents<bool>(const at::Tensor&, int64_t*, int64_t*, bool*);
template DocumentScan scan_documents<int64_t>(const at::Tensor&, int64_t*, int64_t*, int64_t*);

std::optional<std::vector<int32_t>> padded_starts(const DocumentScan& scan, int64_t tokens, int64_t max_documents) {
  std::vector<int32_t> cu = scan.starts;
  if (max_documents > 0) {
    if (static_cast<int64_t>(cu.size()) > max_documents) return std::nullopt;
    cu.resize(static_cast<size_t>(max_documents), static_cast<int32_t>(tokens));  // empty documents at the end
  }
  cu.push_back(static_cast<int32_t>(tokens));
  return cu;
}

namespace {

// The host's form, one pass over the ids: the tensor ops below take about a dozen operators on the CPU, each a few
// milliseconds at batch 64 x 1024 with the intra-op threads, which the trainer's step waited for before its first
// kernel (~50 ms per step on the H200's host, bench/RESULTS.md).
std::optional<Documents> documents_on_host(const at::Tensor& doc_ids) {
  const int64_t b = doc_ids.size(0), t = doc_ids.size(1);
  auto start = at::empty({b, t}, at::kBool), id = at::empty({b, t}, at::kLong), pos = at::empty({b, t}, at::kLong);
  const DocumentScan scan =
      scan_documents(doc_ids, id.data_ptr<int64_t>(), pos.data_ptr<int64_t>(), start.data_ptr<bool>());
  if (!scan.packed) return std::nullopt;
  Documents d;
  d.start = start;
  d.spans.id = id;
  d.pos = pos;
  d.spans.cu_seqlens = at::tensor(*padded_starts(scan, b * t, 0), at::kInt);
  d.spans.max_len = scan.max_len;
  return d;
}

void check_ids(const at::Tensor& doc_ids) {
  if (!doc_ids.defined() || doc_ids.dim() != 2 || at::isFloatingType(doc_ids.scalar_type()))
    throw Error("document ids must be an integer tensor [batch, time], got " + shape_text(doc_ids));
  if (doc_ids.size(1) < 1) throw Error("document ids: the rows hold no tokens");
}

}  // namespace

std::optional<Documents> documents_from_ids(const at::Tensor& doc_ids) {
  check_ids(doc_ids);
  const int64_t b = doc_ids.size(0), t = doc_ids.size(1);
  if (doc_ids.is_cpu()) return documents_on_host(doc_ids);
  auto ids = doc_ids.to(at::kLong);
  auto change = ids.narrow(1, 1, t - 1) != ids.narrow(1, 0, t - 1);
  if (!change.any().item<bool>()) return std::nullopt;
  Documents d;
  d.start = at::cat({at::ones({b, 1}, change.options()), change}, 1);
  d.spans.id = at::cumsum(d.start.to(at::kLong), 1) - 1;
  auto index = at::arange(t, ids.options()).expand({b, t});
  // The index of each token's document start: the running maximum of the start indices.
  auto first = std::get<0>(at::cummax(at::where(d.start, index, at::zeros_like(index)), 1));
  d.pos = index - first;
  // Document boundaries in the flattened rows, computed here (where the ids are, usually the host) so the flash
  // kernel's arguments cost no device-to-host copy in the step.
  auto flat_starts = at::nonzero(d.start.reshape({-1})).reshape({-1});
  auto cu = at::cat({flat_starts, at::full({1}, b * t, flat_starts.options())});
  d.spans.cu_seqlens = cu.to(at::kInt);
  d.spans.max_len = (cu.narrow(0, 1, cu.size(0) - 1) - cu.narrow(0, 0, cu.size(0) - 1)).max().item<int64_t>();
  return d;
}

int64_t count_documents(const at::Tensor& doc_ids) {
  check_ids(doc_ids);
  const auto ids = doc_ids.cpu().to(at::kLong).contiguous();
  const int64_t b = ids.size(0), t = ids.size(1);
  const int64_t* p = ids.data_ptr<int64_t>();
  int64_t n = 0;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < t; ++i) n += i == 0 || p[r * t + i] != p[r * t + i - 1];
  return n;
}

Documents to_device(const Documents& d, const at::Device& device) {
  return {
      {d.spans.id.to(device), d.spans.cu_seqlens.to(device), d.spans.max_len}, d.pos.to(device), d.start.to(device)};
}

Documents narrow_documents(const Documents& d, int64_t n) {
  // Without the flash boundaries: recomputing them would copy to the host in the step, and attention falls back
  // to its masked form for these (MTP) layers.
  return {{d.spans.id.narrow(1, 0, n), at::Tensor(), 0}, d.pos.narrow(1, 0, n), d.start.narrow(1, 0, n)};
}

}  // namespace slm::model
