#include "slm/server/specialists.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "slm/engine/decode_engine.h"
#include "slm/io/run_dir.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/weights.h"
#include "slm/router/route.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/format.h"

namespace slm::server {

namespace {

// seed: of the random weights when there is no checkpoint (each specialist of an ensemble gets its own).
std::shared_ptr<model::HybridLM> load_model(const Recipe& recipe, const std::string& checkpoint, const LoadOptions& o,
                                            uint64_t seed, const std::string& who, std::string& weights) {
  if (checkpoint.empty() && !o.allow_random_weights)
    throw Error(who + ": no checkpoint (give one, or --random-weights to serve random weights)");
  const torch::Device device = parse_device(o.device);
  torch::manual_seed(seed);
  auto m = std::make_shared<model::HybridLM>(recipe);  // on the CPU, so a seed gives the same weights everywhere
  m->eval();
  // Moved before the weights load: NVFP4 matrices are no registered tensors (a later .to() would leave them on the
  // CPU); they are placed on the device of the weight they replace as they load.
  m->to(device);
  if (!checkpoint.empty()) {
    weights = model::weights_path(io::resolve_run_dir(checkpoint));
    model::load_weights(*m, weights);
  } else {
    weights = "random";
  }
  return m;
}

}  // namespace

void Specialists::add(std::string name, std::shared_ptr<model::HybridLM> m, std::unique_ptr<data::Tokenizer> tok,
                      std::vector<std::string> routes, const LoadOptions& o, std::string weights) {
  if (find(name)) throw Error("specialist \"" + name + "\" is already loaded");
  if (name == "auto") throw Error("\"auto\" is reserved for the router; name the specialist otherwise");
  const int64_t vocab = m->recipe().vocab_size;
  if (static_cast<int64_t>(tok->vocab_size()) > vocab)
    throw Error(name + ": the tokenizer's " + std::to_string(tok->vocab_size()) +
                " ids do not fit the recipe's vocabulary of " + std::to_string(vocab));
  auto s = std::make_unique<Specialist>();
  s->name = std::move(name);
  s->routes = std::move(routes);
  s->tokenizer = std::move(tok);
  s->chat = std::make_unique<text::ChatTemplate>(*s->tokenizer);
  s->weights = std::move(weights);
  for (const auto& p : m->parameters()) s->parameters += p.numel();
  const auto memory = model::weight_memory(*m);
  s->weight_bytes = memory.total();
  s->nvfp4_bytes = memory.nvfp4_bytes;
  engine::DecodeEngineOptions eo;
  eo.banned_ids = s->chat->banned_ids(vocab);
  eo.max_queue = o.max_queue;
  eo.slots = o.slots;
  eo.prefix_cache_bytes = o.prefix_cache_mib << 20;
  s->model = engine::EngineModel{std::move(m)};
  s->engine = engine::make_decode_engine(s->model, eo);
  max_queue_ = o.max_queue;
  list_.push_back(std::move(s));
}

void Specialists::set_router(router::Classifier r) {
  bool any = false;
  for (const auto& label : r.labels())
    for (const auto& s : list_) any |= std::find(s->routes.begin(), s->routes.end(), label) != s->routes.end();
  if (!any) throw Error("router: none of its labels is answered by a specialist (set \"routes\" in the manifest)");
  router_ = std::move(r);
}

Specialist* Specialists::find(const std::string& name) const {
  for (const auto& s : list_)
    if (s->name == name) return s.get();
  return nullptr;
}

Route Specialists::route(const std::string& text) const {
  if (!router_) throw Error("no router model is loaded");
  std::vector<std::vector<std::string>> routes;
  for (const auto& s : list_) routes.push_back(s->routes);
  const auto m = router::route_mass(router_->classify(text), router_->labels(), routes);
  Route r;
  std::vector<size_t> order(list_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return m.mass[a] > m.mass[b]; });
  r.specialist = m.best;
  for (size_t i : order) r.probabilities.emplace_back(list_[i]->name, m.total > 0 ? m.mass[i] / m.total : 0.0);
  return r;
}

namespace {

bool same_tokenizer(const data::Tokenizer& a, const data::Tokenizer& b) {
  if (a.vocab_size() != b.vocab_size() || a.bos_id() != b.bos_id() || a.eos_id() != b.eos_id()) return false;
  for (uint32_t id = 0; id < a.vocab_size(); ++id)
    if (a.piece(id) != b.piece(id) || a.is_special(id) != b.is_special(id)) return false;
  return true;
}

}  // namespace

engine::Engine* Specialists::mixture(size_t a, size_t b) const {
  if (a >= list_.size() || b >= list_.size() || a == b) throw Error("mixture: two different specialists are needed");
  if (a > b) std::swap(a, b);
  std::lock_guard lock(mixtures_->mu);
  auto it = mixtures_->engines.find({a, b});
  if (it == mixtures_->engines.end()) {
    const Specialist &x = *list_[a], &y = *list_[b];
    std::unique_ptr<engine::Engine> e;
    if (same_tokenizer(*x.tokenizer, *y.tokenizer)) {
      engine::DecodeEngineOptions eo;
      eo.banned_ids = x.chat->banned_ids(x.model.model->recipe().vocab_size);
      eo.max_queue = max_queue_;
      e = engine::make_mixture_engine({x.model, y.model}, eo);
    }
    it = mixtures_->engines.emplace(std::make_pair(a, b), std::move(e)).first;
  }
  return it->second.get();
}

Specialists Specialists::from_manifest(const Ensemble& e, const LoadOptions& o,
                                       const std::function<void(const std::string&)>& log) {
  Specialists out;
  for (const auto& sp : e.specialists) {
    const std::string who = e.source + ": specialist \"" + sp.name + "\"";
    if (sp.tokenizer.empty()) throw Error(who + ": no tokenizer (add \"tokenizer\": \"path/to/code.model\")");
    auto tok = std::make_unique<data::Tokenizer>(data::Tokenizer::load(sp.tokenizer));
    std::string weights;
    auto m = load_model(sp.recipe, sp.checkpoint, o, o.seed + out.list_.size(), who, weights);
    out.add(sp.name, std::move(m), std::move(tok), sp.routes, o, weights);
    out.list_.back()->description = sp.domain;
    if (log) {
      const auto& s = *out.list_.back();
      log(sp.name + ": " + human_count(s.parameters) + " parameters, " + human_bytes(s.weight_bytes) + " of weights" +
          (s.nvfp4_bytes > 0 ? " (" + human_bytes(s.nvfp4_bytes) + " NVFP4)" : std::string()) + " on " + o.device +
          ", weights " + s.weights + ", tokenizer " + sp.tokenizer);
    }
  }
  if (!e.router.empty()) out.set_router(router::Classifier::load(e.router));
  return out;
}

Specialists Specialists::single(const std::string& recipe_path, const std::string& checkpoint,
                                const std::string& tokenizer, const LoadOptions& o) {
  const Recipe recipe = load_recipe(recipe_path);
  Specialists out;
  std::string weights;
  auto m = load_model(recipe, checkpoint, o, o.seed, recipe_path, weights);
  out.add(recipe.name, std::move(m), std::make_unique<data::Tokenizer>(data::Tokenizer::load(tokenizer)), {recipe.name},
          o, weights);
  return out;
}

}  // namespace slm::server
