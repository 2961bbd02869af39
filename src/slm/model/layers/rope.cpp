#include "slm/model/layers/rope.h"

#include <torch/torch.h>

#include <algorithm>

#include "slm/util/error.h"

namespace slm::model {

RotaryPositions positions(const torch::Tensor& h, const TokenCache* cache, const Documents* docs) {
  if (docs) {
    if (cache) throw Error("attention: packed documents are a training input; a cached sequence is one document");
    return {0, docs->pos, h.size(1)};  // a place in a document of a row of T tokens is below T
  }
  const int64_t start = cache ? cache->length() : 0;
  return {start, torch::Tensor(), start + h.size(1)};
}

Rope::Rope(int64_t dim, double theta) : half_(dim / 2), theta_(theta) {
  if (dim % 2 != 0) throw Error("RoPE needs an even number of dims, got " + std::to_string(dim));
}

std::pair<torch::Tensor, torch::Tensor> Rope::tables(const torch::Device& device, torch::ScalarType dtype,
                                                     int64_t n) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(tables_.begin(), tables_.end(),
                         [&](const Table& t) { return t.device == device && t.dtype == dtype; });
  if (it != tables_.end() && it->cos.size(0) >= n) return {it->cos, it->sin};
  // Doubling keeps the rebuilds of a growing sequence to log2 of its length.
  int64_t rows = 256;
  while (rows < n) rows *= 2;
  if (it != tables_.end()) rows = std::max(rows, 2 * it->cos.size(0));
  torch::NoGradGuard no_grad;
  auto f64 = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto inv_freq = torch::pow(theta_, -torch::arange(0, half_, f64) / static_cast<double>(half_));
  auto angles = torch::arange(rows, f64).unsqueeze(1) * inv_freq;
  Table t{device, dtype, angles.cos().to(dtype), angles.sin().to(dtype)};
  if (it != tables_.end())
    *it = t;
  else
    tables_.push_back(t);
  return {t.cos, t.sin};
}

torch::Tensor Rope::operator()(const torch::Tensor& x, const RotaryPositions& pos) const {
  if (x.dim() != 4 || x.size(3) != 2 * half_)
    throw Error("RoPE: expected x [B, T, heads, " + std::to_string(2 * half_) + "]");
  const int64_t t = x.size(1);
  auto [cos_all, sin_all] = tables(x.device(), x.scalar_type(), pos.end);
  auto rows = [&](const torch::Tensor& table) {  // [B or 1, T, 1, half]
    return pos.ids.defined() ? table.index_select(0, pos.ids.reshape({-1})).view({-1, t, 1, half_})
                             : table.narrow(0, pos.start, t).view({1, t, 1, half_});
  };
  auto cos = rows(cos_all), sin = rows(sin_all);
  auto x1 = x.narrow(3, 0, half_), x2 = x.narrow(3, half_, half_);
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3);
}

}  // namespace slm::model
