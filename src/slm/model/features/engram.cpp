#include "slm/model/features/engram.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

#include "slm/io/safetensors.h"
#include "slm/model/hybrid_lm.h"
#include "slm/ops/rms_norm.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

namespace {

// The demo's gate floor: sqrt is clamped away from 0 where its slope is unbounded.
constexpr double kGateFloor = 1e-6;

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<int64_t> engram_multipliers(int layer, int max_order, int64_t vocab) {
  // x <= vocab and m <= 2·bound + 1 keep x·m <= INT64_MAX (x = vocab is the before-the-start id).
  const int64_t bound = std::max<int64_t>(1, std::numeric_limits<int64_t>::max() / (vocab + 1) / 2);
  uint64_t state = 10007ull * static_cast<uint64_t>(layer);
  std::vector<int64_t> out;
  for (int k = 0; k < max_order; ++k) out.push_back(2 * static_cast<int64_t>(splitmix64(state) % bound) + 1);
  return out;
}

DilatedCausalConvImpl::DilatedCausalConvImpl(int64_t channels, int64_t kernel, int64_t dilation_,
                                             const torch::TensorOptions& options)
    : dilation(dilation_) {
  // Zero: the memory enters as Ṽ alone until the conv learns something (reference §1.4).
  weight = register_parameter("weight", torch::zeros({channels, 1, kernel}, options));
}

std::pair<torch::Tensor, torch::Tensor> DilatedCausalConvImpl::forward(const torch::Tensor& x,
                                                                       const torch::Tensor& tail_in,
                                                                       const torch::Tensor& pos) {
  const int64_t t = x.size(1), keep = tail(), kernel = weight.size(2);
  auto prev = tail_in.defined() ? tail_in.to(x.scalar_type()) : torch::zeros({x.size(0), keep, x.size(2)}, x.options());
  auto full = torch::cat({prev, x}, 1);  // [B, keep + T, C]
  // A few shifted multiply-adds (as CausalConv): cheap at any T and exact for a one-token step.
  torch::Tensor y;
  for (int64_t j = 0; j < kernel; ++j) {
    auto term = full.narrow(1, j * dilation, t) * weight.select(2, j).view({-1});
    // Tap j reads (kernel-1-j)·dilation tokens back: the previous document where pos is smaller.
    if (pos.defined()) term = term * (pos >= (kernel - 1 - j) * dilation).to(term.scalar_type()).unsqueeze(-1);
    y = y.defined() ? y + term : term;
  }
  return {y, full.narrow(1, t, keep)};
}

StreamNormImpl::StreamNormImpl(int64_t streams, int64_t dim, double eps_, const torch::TensorOptions& options)
    : eps(eps_) {
  weight = register_parameter("weight", torch::ones({streams, dim}, options));
}

torch::Tensor StreamNormImpl::forward(const torch::Tensor& x) {
  return ops::rms_norm(x, std::nullopt, eps) * weight;
}

EngramImpl::EngramImpl(const Recipe& r, int layer, int streams_, const std::vector<long long>& table_primes,
                       const torch::TensorOptions& options)
    : orders(r.engram.orders),
      heads(r.engram.heads_per_order),
      streams(streams_),
      vocab(r.vocab_size),
      d_model(r.d_model),
      device_(options.device()) {
  const auto& g = r.engram;
  const int64_t groups = static_cast<int64_t>(orders.size()) * heads;
  if (static_cast<int64_t>(table_primes.size()) != groups)
    throw Error(r.source + ": layer " + std::to_string(layer) + ": Engram needs " + std::to_string(groups) +
                " table sizes, got " + std::to_string(table_primes.size()));
  long long rows_total = 0;
  for (long long p : table_primes) rows_total += p;
  const auto i64 = options.dtype(torch::kLong);
  table = register_parameter("table", torch::empty({rows_total, g.embed_dim}, options));
  multipliers = register_buffer(
      "multipliers", torch::tensor(engram_multipliers(layer, orders.back(), vocab), i64.device(torch::kCPU)).to(i64));
  primes = register_buffer(
      "primes",
      torch::tensor(std::vector<int64_t>(table_primes.begin(), table_primes.end()), i64.device(torch::kCPU)).to(i64));
  const int64_t d_e = groups * g.embed_dim;
  wv = register_module("wv", Linear(d_e, d_model, options));
  wk = register_module("wk", Linear(d_e, streams * d_model, options));
  h_norm = register_module("h_norm", StreamNorm(streams, d_model, r.norm_eps, options));
  k_norm = register_module("k_norm", StreamNorm(streams, d_model, r.norm_eps, options));
  conv_norm = register_module("conv_norm", StreamNorm(streams, d_model, r.norm_eps, options));
  conv = register_module("conv", DilatedCausalConv(streams * d_model, g.conv_kernel, orders.back(), options));
  torch::NoGradGuard no_grad;
  table.normal_();
  // Like every output projection here, the value starts at zero: a fresh Engram adds nothing.
  wv->weight.dense().zero_();
}

torch::Tensor EngramImpl::rows(const torch::Tensor& ids, const torch::Tensor& window, const torch::Tensor& pos) const {
  const auto dev = table.device();
  const int64_t b = ids.size(0), t = ids.size(1), w = orders.back() - 1;
  auto before = window.defined() ? window.to(dev) : torch::full({b, w}, vocab, ids.options().device(dev));
  auto seq = torch::cat({before, ids.to(dev)}, 1);  // [B, w + T]
  auto m = multipliers.to(dev), p = primes.to(dev);
  auto offsets = p.cumsum(0) - p;
  std::vector<torch::Tensor> out;
  torch::Tensor mix;
  int64_t group = 0;
  for (int k = 0; k < orders.back(); ++k) {
    // mix of order k+1 = mix of order k XOR x'_{t-k}·m_k.
    auto back = seq.narrow(1, w - k, t);
    if (pos.defined() && k > 0) back = back.masked_fill(pos.to(dev) < k, vocab);
    auto term = back * m.narrow(0, k, 1);
    mix = mix.defined() ? torch::bitwise_xor(mix, term) : term;
    if (std::find(orders.begin(), orders.end(), k + 1) == orders.end()) continue;
    auto pr = p.narrow(0, group, heads), off = offsets.narrow(0, group, heads);
    out.push_back(torch::remainder(mix.unsqueeze(-1), pr) + off);
    group += heads;
  }
  return torch::cat(out, -1);
}

torch::Tensor EngramImpl::lookup(const torch::Tensor& rows_in) const {
  const int64_t b = rows_in.size(0), t = rows_in.size(1);
  auto flat = rows_in.reshape({-1});
  torch::Tensor e;
  if (!host_) {
    e = table.index_select(0, flat);
  } else if (torch::GradMode::is_enabled()) {
    e = table.index_select(0, flat).to(device_);  // the gradient flows back to the host table
  } else {
    // Gathered into a staging buffer, pinned when the model is on a GPU so the copy is asynchronous.
    auto staging = torch::empty({flat.size(0), table.size(1)}, table.options().pinned_memory(device_.is_cuda()));
    at::index_select_out(staging, table, 0, flat);
    e = staging.to(device_, /*non_blocking=*/true);
  }
  return e.view({b, t, -1});
}

std::pair<torch::Tensor, torch::Tensor> EngramImpl::forward(const torch::Tensor& x, const torch::Tensor& memory,
                                                            const torch::Tensor& conv_tail, const torch::Tensor& pos) {
  if (x.dim() != 4 || x.size(2) != streams || x.size(3) != d_model)
    throw Error("engram: expected streams [batch, time, " + std::to_string(streams) + ", " + std::to_string(d_model) +
                "], got " + shape_text(x));
  auto v = wv(memory);  // [B, T, D]
  auto k = wk(memory).view({x.size(0), x.size(1), streams, d_model});
  auto s = (h_norm(x) * k_norm(k)).sum(-1) / std::sqrt(static_cast<double>(d_model));  // [B, T, n]
  auto gate = torch::sigmoid(torch::sign(s) * torch::sqrt(torch::clamp_min(s.abs(), kGateFloor)));
  auto gated = gate.unsqueeze(-1) * v.unsqueeze(-2);  // [B, T, n, D]
  auto [c, tail] = conv(conv_norm(gated).flatten(-2), conv_tail, pos);
  return {gated + torch::silu(c).view_as(gated), tail};
}

EngramState EngramImpl::zero_state(int64_t batch) const {
  const auto opts = wv->weight.dense().options();
  return {torch::full({batch, orders.back() - 1}, vocab, opts.dtype(torch::kLong)),
          torch::zeros({batch, conv->tail(), streams * d_model}, opts)};
}

torch::Tensor EngramImpl::next_window(const torch::Tensor& window, const torch::Tensor& ids) const {
  return torch::cat({window, ids.to(window.device())}, 1).narrow(1, ids.size(1), window.size(1));
}

void EngramImpl::set_host_resident(bool host) {
  if (host == host_) return;
  if (device_.is_meta()) throw Error("engram: a model on the meta device has no tables to move");
  torch::NoGradGuard no_grad;
  table.set_data(table.to(host ? torch::Device(torch::kCPU) : device_));
  table.mutable_grad() = torch::Tensor();
  host_ = host;
}

namespace {

const char* const kTablesFormat = "slm-engram-tables";
const char* const kCanonicalName = "engram_canonical_ids";

std::string layer_prefix(size_t layer) {
  return "layers." + std::to_string(layer) + ".engram.";
}

std::map<std::string, torch::Tensor> layer_tables(const Engram& e, size_t layer) {
  const auto pre = layer_prefix(layer);
  return {{pre + "table", e->table}, {pre + "multipliers", e->multipliers}, {pre + "primes", e->primes}};
}

}  // namespace

void save_engram_tables(const HybridLM& model, const std::string& path, std::optional<int> layer) {
  const auto& engram = model.engram_layers();
  if (layer && (*layer < 0 || *layer >= static_cast<int>(engram.size()) || !engram[*layer]))
    throw Error(path + ": layer " + std::to_string(*layer) + " of the model built from " + model.recipe().source +
                " has no Engram tables");
  std::map<std::string, torch::Tensor> tensors;
  for (size_t l = 0; l < engram.size(); ++l) {
    if (!engram[l] || (layer && static_cast<int>(l) != *layer)) continue;
    for (auto& [name, t] : layer_tables(engram[l], l)) tensors[name] = t.detach();
  }
  if (tensors.empty()) throw Error(path + ": the model built from " + model.recipe().source + " has no Engram layers");
  tensors[kCanonicalName] = model.engram_canonical_ids;
  safetensors::save(path, tensors, {{"format", kTablesFormat}, {"recipe", model.recipe().name}});
}

void load_engram_tables(HybridLM& model, const std::string& path) {
  safetensors::File file = safetensors::load(path);
  auto fmt = file.metadata.find("format");
  if (fmt == file.metadata.end() || fmt->second != kTablesFormat)
    throw Error(path + ": not an Engram tables file (metadata format is not \"" + kTablesFormat + "\")");
  auto canon = file.tensors.find(kCanonicalName);
  if (canon == file.tensors.end()) throw Error(path + ": tensor " + kCanonicalName + " is missing");
  if (!torch::equal(canon->second, model.engram_canonical_ids.cpu()))
    throw Error(path + ": the tables were hashed with a different canonical token map than the model's (" +
                kCanonicalName + " differs); they would look up the wrong rows");
  std::map<std::string, torch::Tensor> known;
  const auto& engram = model.engram_layers();
  for (size_t l = 0; l < engram.size(); ++l)
    if (engram[l]) known.merge(layer_tables(engram[l], l));
  // Check everything before copying anything.
  size_t copied = 0;
  for (const auto& [name, t] : file.tensors) {
    if (name == kCanonicalName) continue;
    auto it = known.find(name);
    if (it == known.end())
      throw Error(path + ": tensor " + name + " is not an Engram table of the model built from " +
                  model.recipe().source);
    if (t.sizes() != it->second.sizes())
      throw Error(path + ": tensor " + name + " has shape " + shape_text(t.sizes()) + ", the model needs " +
                  shape_text(it->second.sizes()));
    if (t.is_floating_point() != it->second.is_floating_point())
      throw Error(path + ": tensor " + name + " has dtype " + safetensors::dtype_name(t.scalar_type()) + ", expected " +
                  safetensors::dtype_name(it->second.scalar_type()));
    ++copied;
  }
  for (size_t l = 0; l < engram.size(); ++l) {
    if (!engram[l]) continue;
    auto parts = layer_tables(engram[l], l);
    size_t present = 0;
    for (const auto& [name, t] : parts) present += file.tensors.count(name);
    if (present != 0 && present != parts.size())
      throw Error(path + ": layer " + std::to_string(l) + " needs its table, multipliers and primes together");
  }
  if (copied == 0) throw Error(path + ": holds no Engram tables");
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : known) {
    auto it = file.tensors.find(name);
    if (it != file.tensors.end()) t.copy_(it->second.to(t.device(), t.scalar_type()));
  }
}

std::unique_ptr<LayerCache> EngramLayerCache::view_rows(int64_t begin, int64_t count) {
  auto v = std::make_unique<EngramLayerCache>(layer ? layer->view_rows(begin, count) : nullptr, EngramState{}, 0);
  v->engram = std::move(*static_cast<EngramCache*>(engram.view_rows(begin, count).get()));
  return v;
}

void EngramLayerCache::copy_rows(const LayerCache& src, int64_t src_row, int64_t dst_row, int64_t rows,
                                 int64_t tokens) {
  const auto* from = dynamic_cast<const EngramLayerCache*>(&src);
  if (!from || !from->layer != !layer) throw Error("Engram layer cache: copy_rows from a cache of another layer");
  if (layer) layer->copy_rows(*from->layer, src_row, dst_row, rows, tokens);
  engram.copy_rows(from->engram, src_row, dst_row, rows, tokens);
}

}  // namespace slm::model
