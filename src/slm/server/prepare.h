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
  Specialist* specialist = nullptr;  // the one answering, or a mixture's first member (its tokenizer and template)
  engine::Engine* engine = nullptr;  // where the request goes: the specialist's engine or the mixture's
  std::string answered_by;           // the specialist's name, or "a+b" for a mixture
  nlohmann::json routing;  // the router's probability per specialist; null when the model was named
  engine::Request request;
};

// "auto-2": the router's top two specialists decode together, each token drawn from the mixture of their next-token
// distributions weighted by the router's probabilities (Specialists::mixture); when the two use different
// tokenizers the top one answers alone and routing["auto-2"] says why.
// Throws ApiError: 404 for an unknown model (or "auto" without a router among several specialists, "auto-2" without a
// router or a second specialist), 400 for a
// conversation the template refuses or a prompt (plus max_tokens) longer than the context. default_max_tokens
// applies when the request gives none, capped by the context left.
PreparedGeneration prepare_generation(const Specialists& specialists, const GenerationRequest& request,
                                      int64_t default_max_tokens);

}  // namespace slm::server
