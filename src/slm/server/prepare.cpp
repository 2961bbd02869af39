#include "slm/server/prepare.h"

#include <algorithm>

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

}  // namespace

PreparedGeneration prepare_generation(const Specialists& specialists, const GenerationRequest& g,
                                      int64_t default_max_tokens) {
  PreparedGeneration p;
  Specialist& sp = pick(specialists, g, p.routing);
  p.specialist = &sp;
  std::vector<int64_t> ids;
  try {
    ids = g.chat ? sp.chat->chat_prompt(g.messages) : sp.chat->completion_prompt(g.prompt);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages", "invalid_value");
  }
  const int64_t ctx = sp.engine->context_length(), n = static_cast<int64_t>(ids.size());
  if (n >= ctx)
    throw ApiError(400,
                   "the prompt is " + std::to_string(n) + " tokens, and the model's context is " + std::to_string(ctx) +
                       " tokens (prompt and completion together)",
                   g.chat ? "messages" : "prompt", "context_length_exceeded");
  const int64_t max_tokens = g.max_tokens.value_or(std::min(default_max_tokens, ctx - n));
  if (n + max_tokens > ctx)
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
