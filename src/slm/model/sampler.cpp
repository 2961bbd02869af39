#include "slm/model/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "slm/util/error.h"

namespace slm::model {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_rows(const at::Tensor& logits, size_t rows, const char* what) {
  if (logits.dim() != 2) throw Error(std::string(what) + ": expected logits [batch, vocab]");
  if (logits.size(0) != static_cast<int64_t>(rows))
    throw Error(std::string(what) + ": " + std::to_string(rows) + " rows of options for " +
                std::to_string(logits.size(0)) + " rows of logits");
}

// A host vector on device. To a GPU through pinned memory without blocking: a pageable copy would first wait for
// everything queued on the stream (the decode step), so the sampler's kernels could not queue behind it.
template <class T>
at::Tensor on_device(const std::vector<T>& v, const at::Device& device) {
  auto t = torch::tensor(v);
  return device.is_cuda() ? t.pin_memory().to(device, /*non_blocking=*/true) : t;
}

// Per-row parameters [fields, B] double on device: one copy to the device for all of them.
template <class... Field>
at::Tensor row_parameters(const std::vector<SamplerOptions>& rows, const at::Device& device, Field... field) {
  std::vector<double> v;
  v.reserve(sizeof...(Field) * rows.size());
  for (auto f : {field...})
    for (const auto& o : rows) v.push_back(f(o));
  return on_device(v, device).view({static_cast<int64_t>(sizeof...(Field)), -1});
}

std::vector<SamplerOptions> repeat(const SamplerOptions& o, int64_t rows) {
  return std::vector<SamplerOptions>(static_cast<size_t>(rows), o);
}

}  // namespace

at::Tensor apply_penalties(const at::Tensor& logits, const at::Tensor& generated, const at::Tensor& prompt,
                           const std::vector<SamplerOptions>& rows) {
  check_rows(logits, rows.size(), "apply_penalties");
  if (generated.sizes() != logits.sizes() || prompt.sizes() != logits.sizes())
    throw Error("apply_penalties: the token counts must have the logits' shape");
  using F = double (*)(const SamplerOptions&);
  const auto p = row_parameters(rows, logits.device(), F([](const SamplerOptions& o) { return o.repetition_penalty; }),
                                F([](const SamplerOptions& o) { return o.presence_penalty; }),
                                F([](const SamplerOptions& o) { return o.frequency_penalty; }))
                     .to(torch::kFloat)
                     .unsqueeze(2);  // [3, B, 1]
  auto l = logits.to(torch::kFloat);
  const auto count = generated.to(torch::kFloat);
  const auto produced = count > 0;
  l = torch::where(prompt | produced, torch::where(l > 0, l / p[0], l * p[0]), l);
  return l - count * p[2] - produced.to(torch::kFloat) * p[1];
}

at::Tensor filtered_probabilities(const at::Tensor& logits, const std::vector<SamplerOptions>& rows) {
  check_rows(logits, rows.size(), "filtered_probabilities");
  const int64_t v = logits.size(1);
  bool filtered = false;
  for (const auto& o : rows) {
    if (!(o.temperature > 0)) throw Error("filtered_probabilities: a greedy row has no distribution");
    filtered = filtered || (o.top_k > 0 && o.top_k < v) || o.top_p < 1.0;
  }
  using F = double (*)(const SamplerOptions&);
  const auto p = row_parameters(rows, logits.device(), F([](const SamplerOptions& o) { return o.temperature; }),
                                F([](const SamplerOptions& o) { return static_cast<double>(o.top_k); }),
                                F([](const SamplerOptions& o) { return o.top_p < 1.0 ? o.top_p : kInf; }))
                     .unsqueeze(2);  // [3, B, 1]
  auto z = logits.to(torch::kDouble) / p[0];
  if (filtered) {
    // Thresholds on the logits from one sort: the k-th largest, and the smallest of the most likely ids whose mass
    // before them is still below top_p. Rows without a filter get thresholds that mask nothing (k = V, top_p = inf),
    // so a row's result does not depend on the others in the batch.
    const auto sorted = std::get<0>(z.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true));
    const auto k = p[1].to(torch::kLong);
    const auto kth = sorted.gather(1, torch::where((k > 0) & (k < v), k, v) - 1);  // [B, 1]
    const auto mass = torch::softmax(sorted.masked_fill(sorted < kth, -kInf), -1).cumsum(-1);
    const auto before = torch::cat(std::vector<at::Tensor>{torch::zeros_like(kth), mass.narrow(1, 0, v - 1)},
                                   1);                            // exclusive, monotone
    const auto kept = (before < p[2]).sum(-1, /*keepdim=*/true);  // >= 1: before[0] = 0
    z = z.masked_fill(z < torch::maximum(kth, sorted.gather(1, kept - 1)), -kInf);
  }
  return torch::softmax(z, -1);
}

at::Tensor inverse_cdf(const at::Tensor& weights, const std::vector<double>& uniform) {
  check_rows(weights, uniform.size(), "inverse_cdf");
  const int64_t v = weights.size(1);
  const auto w = weights.to(torch::kDouble);
  const auto c = w.cumsum(-1);
  const auto u = on_device(uniform, weights.device()).unsqueeze(1);
  auto id = (c <= c.narrow(1, v - 1, 1) * u).sum(-1);
  // u * sum rounds up to the sum only for u within an ulp of 1: the last id with weight then.
  const auto last = (v - 1) - (w > 0).flip(1).to(torch::kByte).argmax(1);
  return torch::minimum(id, last);
}

Sampler::Sampler(const SamplerOptions& options)
    : options_(options), generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature))
    throw Error("sampler: temperature must be >= 0");
  if (options.top_k < 0) throw Error("sampler: top_k must be >= 0");
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) throw Error("sampler: top_p must be in (0, 1]");
  if (!(options.repetition_penalty > 0) || !std::isfinite(options.repetition_penalty))
    throw Error("sampler: repetition_penalty must be > 0");
  if (!(std::abs(options.presence_penalty) <= 2)) throw Error("sampler: presence_penalty must be in [-2, 2]");
  if (!(std::abs(options.frequency_penalty) <= 2)) throw Error("sampler: frequency_penalty must be in [-2, 2]");
}

void Sampler::set_prompt(const std::vector<int64_t>& prompt) {
  if (!options_.penalized()) return;
  prompt_ = prompt;
  generated_ = prompt_seen_ = at::Tensor();
}

void Sampler::track(const at::Tensor& logits) {
  if (generated_.defined() && generated_.size(0) == logits.size(0)) return;
  const int64_t v = logits.size(1);
  const auto opts = torch::TensorOptions().device(logits.device());
  generated_ = torch::zeros(logits.sizes(), opts.dtype(torch::kFloat));
  prompt_seen_ = torch::zeros(logits.sizes(), opts.dtype(torch::kBool));
  for (int64_t id : prompt_)
    if (id < 0 || id >= v)
      throw Error("sampler: prompt id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(v));
  if (!prompt_.empty()) prompt_seen_.index_fill_(1, on_device(prompt_, logits.device()), true);
}

void Sampler::count(const at::Tensor& ids) {
  generated_.scatter_add_(1, ids.view({-1, 1}), torch::ones({ids.numel(), 1}, generated_.options()));
}

at::Tensor Sampler::sample(const at::Tensor& logits) {
  if (logits.dim() != 2) throw Error("sampler: expected logits [batch, vocab]");
  const int64_t b = logits.size(0);
  auto l = logits;
  if (options_.penalized()) {
    track(logits);
    l = apply_penalties(l, generated_, prompt_seen_, repeat(options_, b));
  }
  at::Tensor ids;
  if (greedy()) {
    ids = l.argmax(-1);
  } else {
    std::vector<double> u(static_cast<size_t>(b));
    for (auto& x : u) x = uniform();
    ids = inverse_cdf(filtered_probabilities(l, repeat(options_, b)), u);
  }
  if (options_.penalized()) count(ids);
  return ids;
}

std::vector<int64_t> Sampler::sample_rows(const std::vector<Sampler*>& samplers, const at::Tensor& logits) {
  check_rows(logits, samplers.size(), "sampler");
  const auto device = logits.device();
  auto index = [&](const std::vector<int64_t>& rows) { return on_device(rows, device); };
  auto options_of = [&](const std::vector<int64_t>& rows) {
    std::vector<SamplerOptions> o;
    for (int64_t r : rows) o.push_back(samplers[static_cast<size_t>(r)]->options_);
    return o;
  };
  std::vector<int64_t> penalized, drawn;
  bool any_greedy = false;
  for (size_t r = 0; r < samplers.size(); ++r) {
    const auto i = static_cast<int64_t>(r);
    if (samplers[r]->options_.penalized()) {
      samplers[r]->track(logits.narrow(0, i, 1));
      penalized.push_back(i);
    }
    if (samplers[r]->greedy())
      any_greedy = true;
    else
      drawn.push_back(i);
  }
  auto l = logits;
  if (!penalized.empty()) {
    std::vector<at::Tensor> generated, prompt;
    for (int64_t r : penalized) {
      generated.push_back(samplers[static_cast<size_t>(r)]->generated_);
      prompt.push_back(samplers[static_cast<size_t>(r)]->prompt_seen_);
    }
    const auto rows = index(penalized);
    l = l.to(torch::kFloat)
            .index_copy(0, rows,
                        apply_penalties(l.index_select(0, rows), torch::cat(generated), torch::cat(prompt),
                                        options_of(penalized)));
  }
  at::Tensor ids = any_greedy ? l.argmax(-1) : at::Tensor();
  if (!drawn.empty()) {
    std::vector<double> u;
    for (int64_t r : drawn) u.push_back(samplers[static_cast<size_t>(r)]->uniform());
    const bool all = drawn.size() == samplers.size();
    const auto rows = all ? at::Tensor() : index(drawn);
    const auto picked = inverse_cdf(filtered_probabilities(all ? l : l.index_select(0, rows), options_of(drawn)), u);
    ids = all ? picked : ids.index_copy(0, rows, picked);
  }
  for (int64_t r : penalized) samplers[static_cast<size_t>(r)]->count(ids.narrow(0, r, 1));
  const auto host = ids.cpu();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

at::Tensor Sampler::probabilities(const at::Tensor& logits) const {
  if (logits.dim() != 2) throw Error("sampler: expected logits [batch, vocab]");
  if (greedy()) throw Error("sampler: a greedy sampler has no distribution to draw from");
  if (options_.penalized()) throw Error("sampler: the penalties depend on the sequence; no fixed distribution");
  return filtered_probabilities(logits.detach(), repeat(options_, logits.size(0))).cpu();
}

at::Tensor Sampler::draw(const at::Tensor& weights) {
  std::vector<double> u(static_cast<size_t>(weights.size(0)));
  for (auto& x : u) x = uniform();
  return inverse_cdf(weights, u);
}

double Sampler::uniform() {
  // 53 random bits straight from the generator: a tensor op per number would cost more than the draw it serves.
  auto* g = at::check_generator<at::CPUGeneratorImpl>(generator_);
  const std::lock_guard<std::mutex> lock(generator_.mutex());
  return static_cast<double>(g->random64() >> 11) * 0x1.0p-53;
}

}  // namespace slm::model
