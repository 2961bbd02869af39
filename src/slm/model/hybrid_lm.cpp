#include "slm/model/hybrid_lm.h"

#include <torch/torch.h>

#include "slm/model/layer_registry.h"
#include "slm/model/layers/attention.h"
#include "slm/model/recompute.h"
#include "slm/ops/cross_entropy.h"
#include "slm/ops/residual_mix.h"
#include "slm/ops/rms_norm.h"
#include "slm/recipe/accounting.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::model {

HybridLM::HybridLM(const Recipe& recipe, const torch::TensorOptions& options)
    : recipe_(recipe), plan_(make_plan(recipe)) {
  const int64_t d = recipe_.d_model, depth = static_cast<int64_t>(plan_.layers.size());
  embed = register_module("embed", Embedding(recipe_.vocab_size, d, options));

  if (!recipe_.mhc.enabled) {  // mHC's stream mixing replaces the lambdas
    // nanochat's schedule: deeper layers keep less of the stream and re-read less of x0.
    auto frac = depth > 1 ? torch::arange(depth, options) / static_cast<double>(depth - 1) : torch::zeros({1}, options);
    resid_lambdas = register_parameter("resid_lambdas", depth > 1 ? 1.15 - 0.10 * frac : torch::ones({1}, options));
    x0_lambdas = register_parameter("x0_lambdas", depth > 1 ? 0.20 - 0.15 * frac : torch::zeros({1}, options));
  }

  layer_list_ = register_module("layers", torch::nn::ModuleList());
  const auto primes = engram_table_primes(recipe_, plan_);
  const int streams = recipe_.mhc.enabled ? recipe_.mhc.streams : 1;
  for (const auto& l : plan_.layers) {
    layers_.push_back(make_layer(recipe_, l, options));
    layer_list_->push_back(layers_.back());
    engram_.push_back(nullptr);
    mhc_.push_back(nullptr);
    if (l.engram) {
      engram_.back() = Engram(recipe_, l.index, streams, primes[l.index], options);
      layers_.back()->register_module("engram", engram_.back());
    }
    if (l.mhc) {
      mhc_.back() = MhcMix(recipe_, l.index, options);
      layers_.back()->register_module("mhc", mhc_.back());
    }
  }
  if (recipe_.engram.enabled)
    engram_canonical_ids =
        register_buffer("engram_canonical_ids", torch::arange(recipe_.vocab_size, options.dtype(torch::kLong)));
  if (recipe_.mhc.enabled) mhc_head = register_module("mhc_head", MhcHead(recipe_, options));
  final_norm = register_module("final_norm", RMSNorm(d, recipe_.norm_eps, options));
  lm_head = register_module("lm_head", Linear(d, recipe_.vocab_size, options));
  {
    torch::NoGradGuard no_grad;
    lm_head->weight.dense().normal_(0.0, 0.001);  // near-uniform first predictions (nanochat)
  }
  if (plan_.mtp_depth > 0) {
    mtp_list_ = register_module("mtp", torch::nn::ModuleList());
    for (int k = 0; k < plan_.mtp_depth; ++k) {
      mtp_.push_back(MtpModule(recipe_, plan_, options));
      mtp_list_->push_back(mtp_.back());
    }
  }
}

torch::Tensor HybridLM::embed_tokens(const torch::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.scalar_type() != torch::kLong)
    throw Error("model input must be int64 token ids [batch, time]");
  auto x = embed(tokens);
  return ops::rms_norm(x, std::nullopt, recipe_.norm_eps);
}

torch::Tensor HybridLM::head(const torch::Tensor& normed, bool raw) {
  auto logits = lm_head(normed);
  return raw || logits.scalar_type() == torch::kDouble ? logits : logits.to(torch::kFloat);
}

torch::Tensor HybridLM::canonical(const torch::Tensor& tokens) const {
  return engram_canonical_ids.index_select(0, tokens.reshape({-1})).view_as(tokens);
}

torch::Tensor HybridLM::trunk(const torch::Tensor& x0, const LayerFn& block, const LayerFn& memory,
                              const LayerFn& block_normed) {
  if (!mhc_head) {
    auto x = x0;
    torch::Tensor y;  // the last layer's output, added to x inside the next mix (one kernel on the GPU)
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (block_normed && !engram_[l]) {
        const auto& norm = *layers_[l]->norm;
        torch::Tensor h;
        std::tie(x, h) = ops::residual_mix_norm(x, y, resid_lambdas[l], x0, x0_lambdas[l], norm.weight, norm.eps);
        y = block_normed(l, h);
        continue;
      }
      x = ops::residual_mix(x, y, resid_lambdas[l], x0, x0_lambdas[l]);
      if (engram_[l]) x = x + memory(l, x.unsqueeze(2)).squeeze(2);
      y = block(l, x);
    }
    return y.defined() ? x + y : x;
  }
  auto streams = x0.unsqueeze(2).expand({-1, -1, recipe_.mhc.streams, -1});
  torch::Tensor mean;  // the streams' mean, when the last plain mix computed it along
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto run = [&](const torch::Tensor& u) { return block(l, u); };
    if (engram_[l]) {
      streams = streams + memory(l, streams);
      mean = torch::Tensor();
    }
    if (mhc_[l]) {
      streams = mhc_[l]->forward(streams, run);
      mean = torch::Tensor();
    } else {
      streams = mhc_plain(streams, run, mean);
    }
  }
  return mhc_head(streams);
}

ModelOutput HybridLM::forward(const torch::Tensor& tokens, const Documents* docs) {
  return forward_impl(tokens, docs, false);
}

ModelOutput HybridLM::forward_impl(const torch::Tensor& tokens, const Documents* docs, bool raw) {
  auto x0 = embed_tokens(tokens);
  if (docs && docs->pos.sizes() != tokens.sizes())
    throw Error("forward: document positions " + shape_text(docs->pos) + " do not match the tokens " +
                shape_text(tokens));
  const auto pos = docs ? docs->pos : torch::Tensor();
  // Engram rows depend on the tokens alone: every layer's memory is gathered before the first layer runs.
  std::vector<torch::Tensor> memory(layers_.size());
  if (engram_canonical_ids.defined()) {
    auto ids = canonical(tokens);
    for (size_t l = 0; l < layers_.size(); ++l)
      if (engram_[l]) memory[l] = engram_[l]->lookup(engram_[l]->rows(ids, {}, pos));
  }
  // Layer l on x (normed: on h = its norm of x, which the trunk computed with the residual mix).
  auto run_layer = [&](size_t l, const torch::Tensor& in, bool normed) {
    auto call = [normed](Layer& layer, const torch::Tensor& u, const Documents* d) {
      return normed ? layer.forward_normed(u, d) : layer.forward(u, d);
    };
    const LayerPlan& p = plan_.layers[l];
    // MoE layers (expert loads, the aux loss) and DSA attention (the indexer's KL loss) record state in their
    // forward, which a rerun would record again; the other layers are pure functions of their input.
    const bool pure = p.family != Family::MoE && !(p.family == Family::Attention && p.dsa);
    if (!recompute_ || !is_training() || !pure) return call(*layers_[l], in, docs);
    // The rerun happens in the backward, after this call returns: the layer and the documents are held by value.
    std::shared_ptr<Layer> layer = layers_[l];
    std::optional<Documents> d = docs ? std::optional<Documents>(*docs) : std::nullopt;
    return recompute(in, [layer, d, call](const torch::Tensor& u) { return call(*layer, u, d ? &*d : nullptr); });
  };
  auto x = trunk(
      x0, [&](size_t l, const torch::Tensor& u) { return run_layer(l, u, false); },
      [&](size_t l, const torch::Tensor& s) { return engram_[l]->forward(s, memory[l], {}, pos).first; },
      [&](size_t l, const torch::Tensor& h) { return run_layer(l, h, true); });
  return {head(final_norm(x), raw), x};
}

std::vector<torch::Tensor> HybridLM::mtp_logits(const torch::Tensor& tokens, const torch::Tensor& hidden,
                                                const Documents* docs) {
  return mtp_impl(tokens, hidden, docs, false);
}

std::vector<torch::Tensor> HybridLM::mtp_impl(const torch::Tensor& tokens, const torch::Tensor& hidden,
                                              const Documents* docs, bool raw) {
  std::vector<torch::Tensor> out;
  const int64_t t = tokens.size(1);
  auto h = hidden;
  for (int64_t k = 1; k <= static_cast<int64_t>(mtp_.size()) && k < t; ++k) {
    const int64_t n = t - k;
    // Position i reads token i+k, which may lie in the next document; such positions' targets are left out.
    std::optional<Documents> part;
    if (docs) part = narrow_documents(*docs, n);
    h = mtp_[k - 1]->forward(h.narrow(1, 0, n), embed(tokens.narrow(1, k, n)), part ? &*part : nullptr);
    out.push_back(head(mtp_[k - 1]->norm(h), raw));
  }
  return out;
}

namespace {
std::vector<DsaIndexerImpl*> dsa_indexers(const std::vector<std::shared_ptr<Layer>>& layers) {
  std::vector<DsaIndexerImpl*> out;
  for (const auto& l : layers)
    if (auto* a = dynamic_cast<AttentionLayer*>(l.get()); a && a->indexer()) out.push_back(a->indexer());
  return out;
}

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return ops::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), kIgnoreIndex);
}
}  // namespace

LossOutput HybridLM::loss(const torch::Tensor& tokens, const torch::Tensor& targets, const torch::Tensor& doc_ids) {
  if (targets.sizes() != tokens.sizes()) throw Error("loss: targets must have the shape of tokens");
  const int64_t b = tokens.size(0), t = tokens.size(1);
  std::optional<Documents> docs;
  torch::Tensor window_docs;  // [B, T+1] on the tokens' device
  if (doc_ids.defined()) {
    if (doc_ids.dim() != 2 || doc_ids.size(0) != b || doc_ids.size(1) != t + 1)
      throw Error("loss: document ids must be [batch, time + 1] (tokens and the last target), got " +
                  shape_text(doc_ids) + " for tokens " + shape_text(tokens));
    if (auto d = documents_from_ids(doc_ids.narrow(1, 0, t))) docs = to_device(*d, tokens.device());
    window_docs = doc_ids.to(tokens.device(), torch::kLong);
  }
  return loss(tokens, targets, docs ? &*docs : nullptr, window_docs);
}

LossOutput HybridLM::loss(const torch::Tensor& tokens, const torch::Tensor& targets, const Documents* docs,
                          const torch::Tensor& window_docs) {
  if (targets.sizes() != tokens.sizes()) throw Error("loss: targets must have the shape of tokens");
  const int64_t t = tokens.size(1);
  LossOutput out;
  // The logits stay in the head's dtype: the loss reads them as they are (ops/cross_entropy.h).
  auto fwd = forward_impl(tokens, docs, true);
  out.main = cross_entropy(fwd.logits, targets);
  out.total = out.main;
  auto mtp = mtp_impl(tokens, fwd.hidden, docs, true);
  for (size_t i = 0; i < mtp.size(); ++i) {
    const int64_t k = static_cast<int64_t>(i) + 1;
    auto target = targets.narrow(1, k, t - k);
    // Module k at position i predicts token i+k+1 of the window: kept only inside position i's document.
    if (window_docs.defined())
      target = target.masked_fill(window_docs.narrow(1, k + 1, t - k) != window_docs.narrow(1, 0, t - k), kIgnoreIndex);
    out.mtp.push_back(cross_entropy(mtp[i], target));
    out.total = out.total + out.mtp.back() * (recipe_.mtp.lambda / static_cast<double>(plan_.mtp_depth));
  }
  out.aux = torch::zeros({}, out.main.options());
  for (auto* m : moe_modules())
    if (m->aux_loss().defined()) out.aux = out.aux + m->aux_loss().to(out.aux.scalar_type());
  out.total = out.total + out.aux;
  out.indexer = torch::zeros({}, out.main.options());
  for (auto* i : dsa_indexers(layers_))
    if (i->loss().defined()) out.indexer = out.indexer + i->loss().to(out.indexer.scalar_type());
  out.total = out.total + out.indexer;
  return out;
}

DecodeState HybridLM::new_state(int64_t batch, int64_t capacity, int64_t max_rollback) const {
  if (batch < 1 || capacity < 1) throw Error("decode state needs batch >= 1 and capacity >= 1");
  DecodeState s;
  const auto& opts = embed->weight.options();
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto cache = layers_[l]->make_cache(batch, capacity, max_rollback);
    if (engram_[l])
      cache = std::make_unique<EngramLayerCache>(std::move(cache), engram_[l]->zero_state(batch), max_rollback);
    s.layers.push_back(std::move(cache));
  }
  s.tokens = torch::zeros({batch, capacity}, opts.dtype(torch::kLong));
  s.positions = torch::zeros({batch}, opts.dtype(torch::kLong));
  for (auto& c : s.layers) {
    auto* tc = dynamic_cast<TokenCache*>(c.get());
    if (auto* e = dynamic_cast<EngramLayerCache*>(c.get())) tc = dynamic_cast<TokenCache*>(e->layer.get());
    if (tc) tc->set_positions(s.positions);
  }
  if (!mtp_.empty()) s.hidden = torch::zeros({batch, capacity, recipe_.d_model}, opts);
  s.max_rollback = max_rollback;
  return s;
}

torch::Tensor HybridLM::run_cached(const torch::Tensor& tokens, DecodeState& state, bool step, bool last_only) {
  torch::NoGradGuard no_grad;
  if (tokens.size(0) != state.batch())
    throw Error("prefill/decode: batch " + std::to_string(tokens.size(0)) + " does not match the state's batch " +
                std::to_string(state.batch()));
  if (state.length + tokens.size(1) > state.capacity())
    throw Error("prefill/decode: " + std::to_string(state.length) + " + " + std::to_string(tokens.size(1)) +
                " tokens exceed the state's capacity " + std::to_string(state.capacity()));
  auto x0 = embed_tokens(tokens);
  auto engram_cache = [&](size_t l) { return static_cast<EngramLayerCache*>(state.layers[l].get()); };
  std::vector<torch::Tensor> memory(layers_.size());
  torch::Tensor ids;
  if (engram_canonical_ids.defined()) {
    ids = canonical(tokens);
    for (size_t l = 0; l < layers_.size(); ++l)
      if (engram_[l]) memory[l] = engram_[l]->lookup(engram_[l]->rows(ids, engram_cache(l)->engram.state().window));
  }
  auto block = [&](size_t l, const torch::Tensor& h) {
    auto* cache = engram_[l] ? engram_cache(l)->layer.get() : state.layers[l].get();
    return step ? layers_[l]->decode(h, cache) : layers_[l]->prefill(h, cache);
  };
  // Engram steps its state like a recurrent layer so that rollback can reach the last max_rollback tokens.
  auto engram = [&](size_t l, const torch::Tensor& s) {
    int64_t at = 0;
    return run_recurrent(engram_cache(l)->engram, s, [&](const torch::Tensor& part, const EngramState& before) {
      const int64_t n = part.size(1);
      auto [y, tail] = engram_[l]->forward(part, memory[l].narrow(1, at, n), before.tail);
      EngramState after{engram_[l]->next_window(before.window, ids.narrow(1, at, n)), tail};
      at += n;
      return std::make_pair(y, std::move(after));
    });
  };
  auto x = trunk(x0, block, engram);
  state.push(tokens, x);
  return head(final_norm(last_only ? x.narrow(1, x.size(1) - 1, 1) : x));
}

torch::Tensor HybridLM::prefill(const torch::Tensor& tokens, DecodeState& state) {
  return run_cached(tokens, state, false);
}

torch::Tensor HybridLM::prefill_last(const torch::Tensor& tokens, DecodeState& state) {
  if (tokens.dim() != 2 || tokens.size(1) < 1) throw Error("prefill_last: expected tokens [batch, T] with T >= 1");
  return run_cached(tokens, state, false, /*last_only=*/true).squeeze(1);
}

torch::Tensor HybridLM::decode(const torch::Tensor& token, DecodeState& state) {
  if (token.dim() != 1) throw Error("decode: expected one token per sequence, shape [batch]");
  return run_cached(token.unsqueeze(1), state, true).squeeze(1);
}

torch::Tensor HybridLM::draft(DecodeState& state, const torch::Tensor& next_token) {
  if (mtp_.empty()) throw Error(recipe_.source + ": draft: the recipe has no MTP modules (mtp.depth is 0)");
  if (state.length < 1) throw Error("draft: the state holds no tokens; prefill first");
  if (next_token.dim() != 1 || next_token.size(0) != state.batch())
    throw Error("draft: expected one next token per sequence, shape [" + std::to_string(state.batch()) + "]");
  torch::NoGradGuard no_grad;
  const int64_t n = state.length, depth = static_cast<int64_t>(mtp_.size());
  if (state.mtp.empty()) {
    // Rollback of the state can unsettle positions the last draft settled: the caches reach that far back and over
    // the depth speculative positions each draft drops.
    const int64_t reach = state.max_rollback + depth;
    for (const auto& m : mtp_) {
      MtpCache c;
      for (const auto& layer : m->layers) c.layers.push_back(layer->make_cache(state.batch(), state.capacity(), reach));
      c.hidden = torch::zeros_like(state.hidden);
      state.mtp.push_back(std::move(c));
    }
  }
  // The tokens past the history: next_token (t_n), then the drafts as they come.
  std::vector<torch::Tensor> tail = {next_token.view({-1, 1})};
  std::vector<torch::Tensor> drafts;
  for (int64_t k = 1; k <= depth; ++k) {
    auto& c = state.mtp[k - 1];
    const int64_t from = c.length, count = n - from;
    // Module k at position i reads h^{k-1}_i and t_{i+k}: t_{from+k}..t_{n-1+k}, from the history and the tail.
    const int64_t start = from + k;
    std::vector<torch::Tensor> parts;
    if (start < n) parts.push_back(state.tokens.narrow(1, start, n - start));
    parts.insert(parts.end(), tail.begin(), tail.end());
    auto ahead = torch::cat(parts, 1).narrow(1, std::max<int64_t>(0, start - n), count);
    const auto& prev = k == 1 ? state.hidden : state.mtp[k - 2].hidden;
    auto h = mtp_[k - 1]->prefill(prev.narrow(1, from, count), embed(ahead), c.layers);
    c.hidden.narrow(1, from, count).copy_(h);
    drafts.push_back(head(mtp_[k - 1]->norm(h.narrow(1, count - 1, 1))).squeeze(1).argmax(-1));
    tail.push_back(drafts.back().view({-1, 1}));
    // Positions n-k.. read next_token or drafts: not settled.
    const int64_t settled = std::max<int64_t>(0, n - k);
    for (auto& layer_cache : c.layers)
      if (layer_cache) layer_cache->rollback(n - settled);
    c.length = settled;
  }
  return torch::stack(drafts, 1);
}

DecodeSupport HybridLM::decode_support() const {
  DecodeSupport out;
  for (const auto& e : engram_)
    if (e && e->host_resident()) out.cuda_graph = "Engram tables in host memory are gathered on the host";
  for (const auto& l : layers_) {
    const DecodeSupport s = l->decode_support();
    if (out.batched_rows.empty()) out.batched_rows = s.batched_rows;
    if (out.cuda_graph.empty()) out.cuda_graph = s.cuda_graph;
  }
  return out;
}

std::vector<MoEImpl*> HybridLM::moe_modules() const {
  std::vector<MoEImpl*> out;
  auto collect = [&](const std::vector<std::shared_ptr<Layer>>& ls) {
    for (const auto& l : ls)
      if (auto* e = dynamic_cast<MoELayer*>(l.get())) out.push_back(e->moe.get());
  };
  collect(layers_);
  for (const auto& m : mtp_) collect(m->layers);
  return out;
}

void HybridLM::update_balancing_biases() {
  for (auto* m : moe_modules()) m->update_bias();
}

void HybridLM::spread_experts(const std::shared_ptr<ExpertGroup>& group) {
  const auto moes = moe_modules();
  if (moes.empty()) throw Error(recipe_.source + ": expert parallelism needs MoE layers; the recipe has none");
  for (auto* m : moes) m->spread_experts(group);
}

int HybridLM::expert_parallel() const {
  for (auto* m : moe_modules())
    if (m->expert_group()) return m->expert_group()->size();
  return 1;
}

bool is_routed_expert(const std::string& param_name) {
  return param_name.find(".moe.experts.") != std::string::npos;
}

void HybridLM::set_dsa_stage(DsaStage stage) {
  for (auto* i : dsa_indexers(layers_)) i->stage = stage;
}

std::vector<torch::Tensor> HybridLM::indexer_parameters() const {
  std::vector<torch::Tensor> out;
  for (auto* i : dsa_indexers(layers_))
    for (auto& p : i->parameters()) out.push_back(p);
  return out;
}

void HybridLM::set_engram_canonical_ids(const std::vector<int64_t>& map) {
  if (!engram_canonical_ids.defined())
    throw Error(recipe_.source + ": the recipe places no Engram layers, so there is no canonical token map to set");
  const int64_t v = recipe_.vocab_size;
  if (static_cast<int64_t>(map.size()) != v)
    throw Error(recipe_.source + ": Engram canonical map has " + std::to_string(map.size()) +
                " entries for a vocabulary of " + std::to_string(v));
  for (size_t i = 0; i < map.size(); ++i)
    if (map[i] < 0 || map[i] >= v)
      throw Error(recipe_.source + ": Engram canonical map sends token " + std::to_string(i) + " to " +
                  std::to_string(map[i]) + ", outside [0, " + std::to_string(v) + ")");
  torch::NoGradGuard no_grad;
  engram_canonical_ids.copy_(torch::tensor(map, torch::kLong));
}

void HybridLM::set_engram_host_resident(bool host) {
  for (auto& e : engram_)
    if (e) e->set_host_resident(host);
}

ModelSummary summarize(const HybridLM& model) {
  ModelSummary s;
  const auto& plan = model.plan();
  for (size_t i = 0; i < model.layers().size(); ++i) {
    LayerSummary ls;
    ls.index = static_cast<int>(i);
    ls.letter = model.layers()[i]->letter();
    ls.class_name = model.layers()[i]->class_name();
    ls.features = plan.layers[i].features();
    s.layers.push_back(ls);
  }
  const auto& moe = model.recipe().moe;
  for (const auto& p : model.named_parameters()) {
    const std::string& name = p.key();
    const int64_t n = p.value().numel();
    const bool routed = is_routed_expert(name);
    const int64_t active = routed ? n / moe->routed_experts * moe->experts_per_token : n;
    s.bytes += n * static_cast<int64_t>(p.value().element_size());
    if (name.size() > 13 && name.compare(name.size() - 13, 13, ".engram.table") == 0) {
      s.engram_tables += n;
      continue;
    }
    if (name.rfind("mtp.", 0) == 0) {
      s.mtp_total += n;
      continue;
    }
    s.total += n;
    s.active += active;
    if (name.rfind("layers.", 0) == 0) {
      auto& ls = s.layers[std::stoul(name.substr(7, name.find('.', 7) - 7))];
      ls.params += n;
      ls.active += active;
    }
  }
  for (const auto& b : model.named_buffers()) {
    s.buffers += b.value().numel();
    s.bytes += b.value().numel() * static_cast<int64_t>(b.value().element_size());
  }
  return s;
}

}  // namespace slm::model
