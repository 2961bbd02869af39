#include "slm/server/prepare.h"

#include <algorithm>
#include <string>
#include <vector>

#include "slm/server/llama_api.h"

namespace slm::server {

namespace {

Specialist& pick(const Specialists& specialists, const GenerationRequest& g, nlohmann::json& routing) {
  if (g.model == "auto") {
    if (specialists.has_router()) {
      const auto r = specialists.route(g.routing_text());
      routing = nlohmann::json::object();
      for (const auto& [name, p] : r.probabilities) routing[name] = p;
      return *specialists.all()[r.specialist];
    }
    if (specialists.all().size() == 1) return *specialists.all()[0];
    throw ApiError(404, "model \"auto\" needs a router model, and none is loaded: name a specialist instead", "model",
                   "model_not_found");
  }
  if (Specialist* s = specialists.find(g.model)) return *s;
  throw ApiError(404, "the model \"" + g.model + "\" does not exist (GET /v1/models lists them)", "model",
                 "model_not_found");
}

size_t index_of(const Specialists& specialists, const std::string& name) {
  const auto& all = specialists.all();
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i]->name == name) return i;
  throw Error("router: no specialist named " + name);
}

// The router's top two as a mixture (or the top one alone when they cannot mix); fills p's specialist, engine,
// answered_by, routing and mixture weights.
void pick_pair(const Specialists& specialists, const GenerationRequest& g, PreparedGeneration& p) {
  if (!specialists.has_router() || specialists.all().size() < 2)
    throw ApiError(404, "model \"auto-2\" needs a router model and at least two specialists", "model",
                   "model_not_found");
  const auto r = specialists.route(g.routing_text());
  p.routing = nlohmann::json::object();
  for (const auto& [name, prob] : r.probabilities) p.routing[name] = prob;
  const size_t a = index_of(specialists, r.probabilities[0].first), b = index_of(specialists, r.probabilities[1].first);
  Specialist& first = *specialists.all()[a];
  p.specialist = &first;
  if (engine::Engine* mix = specialists.mixture(a, b)) {
    p.engine = mix;
    p.answered_by = first.name + "+" + specialists.all()[b]->name;
    // Weights in index order; a specialist the router gives nothing still gets a sliver (weights must be positive).
    const double wa = std::max(r.probabilities[0].second, 1e-6), wb = std::max(r.probabilities[1].second, 1e-6);
    p.request.mixture_weights = a < b ? std::vector<double>{wa, wb} : std::vector<double>{wb, wa};
  } else {
    p.engine = first.engine.get();
    p.answered_by = first.name;
    p.routing["auto-2"] = "the top two specialists use different tokenizers; " + first.name + " answered alone";
  }
}

// A completion with a suffix: the infill prompt (llama_api.h) in the budget the completion leaves, from the named
// specialist or, for "auto", the one of the text's file type (else the router's).
PreparedGeneration prepare_fill(const Specialists& specialists, const GenerationRequest& g,
                                int64_t default_max_tokens) {
  PreparedGeneration p;
  p.specialist = g.model == "auto" ? &infill_specialist(specialists, "", "", g.prompt + *g.suffix, p.routing)
                                   : &pick(specialists, g, p.routing);
  p.engine = p.specialist->engine.get();
  p.answered_by = p.specialist->name;
  const int64_t ctx = p.engine->context_length();
  const int64_t max_tokens = g.max_tokens.value_or(std::min(default_max_tokens, ctx / 2));
  if (max_tokens >= ctx)
    throw ApiError(400,
                   "max_tokens (" + std::to_string(max_tokens) +
                       ") leaves no room for a prompt in the model's context of " + std::to_string(ctx) + " tokens",
                   "max_tokens", "context_length_exceeded");
  text::InfillRequest fill;
  fill.prefix = g.prompt;
  fill.suffix = *g.suffix;
  const auto prompt = infill_prompt_for(*p.specialist, fill, ctx - max_tokens);
  p.request.prompt = prompt.ids;
  p.request.cache_points = infill_cache_points(*p.specialist, prompt);
  p.request.sampling = g.sampling;
  p.request.max_tokens = max_tokens;
  p.request.stop_ids = p.specialist->chat->stop_ids();
  return p;
}

}  // namespace

PreparedGeneration prepare_generation(const Specialists& specialists, const GenerationRequest& g,
                                      int64_t default_max_tokens) {
  PreparedGeneration p;
  if (g.suffix) return prepare_fill(specialists, g, default_max_tokens);
  if (g.model == "auto-2") {
    pick_pair(specialists, g, p);
  } else {
    p.specialist = &pick(specialists, g, p.routing);
    p.engine = p.specialist->engine.get();
    p.answered_by = p.specialist->name;
  }
  Specialist& sp = *p.specialist;
  std::vector<int64_t> ids;
  try {
    ids = g.chat ? sp.chat->chat_prompt(g.messages) : sp.chat->completion_prompt(g.prompt);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages", "invalid_value");
  }
  const int64_t ctx = p.engine->context_length(), n = static_cast<int64_t>(ids.size());
  if (n >= ctx)
    throw ApiError(400,
                   "the prompt is " + std::to_string(n) + " tokens, and the model's context is " + std::to_string(ctx) +
                       " tokens (prompt and completion together)",
                   g.chat ? "messages" : "prompt", "context_length_exceeded");
  const int64_t max_tokens = g.max_tokens.value_or(std::min(default_max_tokens, ctx - n));
  if (max_tokens > ctx - n)  // not n + max_tokens > ctx: max_tokens may be near 2^63 (signed overflow)
    throw ApiError(400,
                   "the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" + std::to_string(max_tokens) +
                       ") exceeds the model's context of " + std::to_string(ctx) + " tokens",
                   "max_tokens", "context_length_exceeded");
  p.request.prompt = std::move(ids);
  p.request.sampling = g.sampling;
  p.request.max_tokens = max_tokens;
  p.request.stop_ids = sp.chat->stop_ids();
  return p;
}

}  // namespace slm::server
