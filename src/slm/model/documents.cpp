#include "slm/model/documents.h"

#include <ATen/ATen.h>

#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

std::optional<Documents> documents_from_ids(const at::Tensor& doc_ids) {
  if (!doc_ids.defined() || doc_ids.dim() != 2 || at::isFloatingType(doc_ids.scalar_type()))
    throw Error("document ids must be an integer tensor [batch, time], got " + shape_text(doc_ids));
  const int64_t b = doc_ids.size(0), t = doc_ids.size(1);
  if (t < 1) throw Error("document ids: the rows hold no tokens");
  auto ids = doc_ids.to(at::kLong);
  auto change = ids.narrow(1, 1, t - 1) != ids.narrow(1, 0, t - 1);
  if (!change.any().item<bool>()) return std::nullopt;
  Documents d;
  d.start = at::cat({at::ones({b, 1}, change.options()), change}, 1);
  d.id = at::cumsum(d.start.to(at::kLong), 1) - 1;
  auto index = at::arange(t, ids.options()).expand({b, t});
  // The index of each token's document start: the running maximum of the start indices.
  auto first = std::get<0>(at::cummax(at::where(d.start, index, at::zeros_like(index)), 1));
  d.pos = index - first;
  return d;
}

Documents to_device(const Documents& d, const at::Device& device) {
  return {d.id.to(device), d.pos.to(device), d.start.to(device)};
}

Documents narrow_documents(const Documents& d, int64_t n) {
  return {d.id.narrow(1, 0, n), d.pos.narrow(1, 0, n), d.start.narrow(1, 0, n)};
}

}  // namespace slm::model
