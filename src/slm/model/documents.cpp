#include "slm/model/documents.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <vector>

#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

namespace {

// The host's form, one pass over the ids: the tensor ops below take about a dozen operators on the CPU, each a few
// milliseconds at batch 64 x 1024 with the intra-op threads, which the trainer's step waited for before its first
// kernel (~50 ms per step on the H200's host, bench/RESULTS.md).
std::optional<Documents> documents_on_host(const at::Tensor& doc_ids) {
  const int64_t b = doc_ids.size(0), t = doc_ids.size(1);
  auto start = at::empty({b, t}, at::kBool), id = at::empty({b, t}, at::kLong), pos = at::empty({b, t}, at::kLong);
  bool* sp = start.data_ptr<bool>();
  int64_t *ip = id.data_ptr<int64_t>(), *pp = pos.data_ptr<int64_t>();
  std::vector<int32_t> cu;
  bool packed = false;
  int64_t max_len = 0;
  // The ids in their own integer type, read through their strides (no conversion or contiguous copy).
  AT_DISPATCH_INTEGRAL_TYPES(doc_ids.scalar_type(), "documents_on_host", [&] {
    const auto acc = doc_ids.accessor<scalar_t, 2>();
    for (int64_t r = 0; r < b; ++r) {
      int64_t doc = 0, at = 0;
      for (int64_t i = 0; i < t; ++i) {
        const bool first = i == 0 || acc[r][i] != acc[r][i - 1];
        packed = packed || (first && i > 0);
        if (first) {
          if (i > 0) ++doc;
          at = 0;
          cu.push_back(static_cast<int32_t>(r * t + i));
        }
        const int64_t k = r * t + i;
        sp[k] = first, ip[k] = doc, pp[k] = at++;
        max_len = std::max(max_len, at);
      }
    }
  });
  if (!packed) return std::nullopt;
  cu.push_back(static_cast<int32_t>(b * t));
  Documents d;
  d.start = start;
  d.spans.id = id;
  d.pos = pos;
  d.spans.cu_seqlens = at::tensor(cu, at::kInt);
  d.spans.max_len = max_len;
  return d;
}

}  // namespace

std::optional<Documents> documents_from_ids(const at::Tensor& doc_ids) {
  if (!doc_ids.defined() || doc_ids.dim() != 2 || at::isFloatingType(doc_ids.scalar_type()))
    throw Error("document ids must be an integer tensor [batch, time], got " + shape_text(doc_ids));
  const int64_t b = doc_ids.size(0), t = doc_ids.size(1);
  if (t < 1) throw Error("document ids: the rows hold no tokens");
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
