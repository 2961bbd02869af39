#pragma once
// From a parsed request to what the engine runs: which specialist answers (named, or the router's pick for "auto"),
// the prompt ids through its chat template, and the limits checked against its context. Shared by the HTTP server
// and the in-process `slm chat`.
#include <nlohmann/json.hpp>

#include "slm/engine/engine.h"
#include "slm/server/openai.h"
#include "slm/server/specialists.h"

namespace slm::server {

struct PreparedGeneration {
  Specialist* specialist = nullptr;
  nlohmann::json routing;  // the router's probability per specialist; null when the model was named
  engine::Request request;
};

// Throws ApiError: 404 for an unknown model (or "auto" without a router among several specialists), 400 for a
// conversation the template refuses or a prompt (plus max_tokens) longer than the context. default_max_tokens
// applies when the request gives none, capped by the context left.
PreparedGeneration prepare_generation(const Specialists& specialists, const GenerationRequest& request,
                                      int64_t default_max_tokens);

}  // namespace slm::server
