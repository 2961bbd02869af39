#pragma once
// The subset of Ollama's HTTP API (ollama/ollama docs/api.md) that local-assistant clients call: Continue's
// autocomplete with provider "ollama", Twinny, vim-ollama, the `ollama` Python client. docs/serving.md ("Ollama API")
// lists every accepted field and what the server does with it.
//   GET  /api/tags, /api/ps, /api/version     the models (each specialist, and "auto" where it routes)
//   POST /api/show                            one model: its template (with .Suffix: it fills the middle), details
//   POST /api/generate                        prompt, suffix (fill in the middle, SPM order), system, raw, options
//   POST /api/chat                            messages through the specialist's chat template
// Generation streams by default (stream: true, as Ollama): newline-delimited JSON objects, the last with done: true
// and the counts and durations (nanoseconds). Errors are Ollama's {"error": "message"}. A field whose effect the
// server cannot give (format, images, tools, think, a sampler we lack) is a 400, never silently ignored; fields
// that do not change the answer (keep_alive, load-time options such as num_gpu) are accepted and have no effect.
// Parsing and formatting are pure functions here; http_server.cpp only routes.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "slm/server/openai.h"
#include "slm/server/response_format.h"
#include "slm/server/specialists.h"

namespace slm::server {

// GET /api/version's: not a release of Ollama, but a version recent enough for clients that require one.
inline constexpr const char* kOllamaVersion = "0.13.0";

// Ollama's error body: {"error": "message"}.
nlohmann::json ollama_error_body(const ApiError& e);

// A timestamp as Ollama writes created_at and modified_at: RFC 3339 in UTC with nanoseconds,
// "2023-08-04T19:22:45.499127455Z".
std::string ollama_time(std::chrono::system_clock::time_point t);

// What /api/tags, /api/ps and /api/show say about one model.
struct OllamaModel {
  std::string name;  // a specialist's, or "auto"
  std::string description;
  int64_t size = 0;          // bytes of weights
  int64_t parameters = 0;    // dense parameter count
  std::string quantization;  // "NVFP4", "F32", "BF16"; "mixed" for "auto" over specialists that differ
  std::string modified_at;   // ollama_time of the weights file (the epoch for random weights)
  std::string digest;        // 64 hex digits naming the weights (not a hash of the file's bytes, see .cpp)
  int64_t context_length = 0, vocab_size = 0;
  bool insert = false;  // the tokenizer has the fill-in-the-middle tokens: /api/generate takes a suffix
};

// Each specialist, then "auto" when routable (a router, or a single specialist), as GET /v1/models lists them.
std::vector<OllamaModel> ollama_models(const Specialists& specialists);
nlohmann::json ollama_tags_json(const std::vector<OllamaModel>& models);
nlohmann::json ollama_ps_json(const std::vector<OllamaModel>& models);
// The Go template that describes the prompts the server builds (fill in the middle when .Suffix is set, else the
// chat turn); without the fill-in-the-middle tokens, only the chat turn.
std::string ollama_template(bool insert);
// POST /api/show's answer for the model named in the body ({"model": ...}, or the older {"name": ...}); throws
// ApiError 400 (malformed body) or 404 (no such model).
nlohmann::json ollama_show_json(const std::vector<OllamaModel>& models, const std::string& body);
// A model name as clients send it: "cpp" or "cpp:latest" (Ollama's default tag) name the specialist "cpp".
std::string ollama_model_name(const std::string& name);

// A parsed POST /api/generate (chat = false) or /api/chat (chat = true) body.
struct OllamaRequest {
  bool chat = false;
  std::string model;                // as the client wrote it (echoed in every answer, as Ollama does)
  GenerationRequest generation;     // model (its tag dropped), messages or prompt, sampling, stop, stream
  std::string suffix;               // generate: non-empty means fill in the middle (prompt: the text before the cursor)
  std::string system;               // generate: the system message of the chat turn
  bool raw = false;                 // generate: the prompt as it is (after <|bos|>), no chat turn
  bool predict_to_context = false;  // num_predict <= 0: until a stop or the context is full
  std::optional<int64_t> num_ctx;   // the context the client asks for (at most the model's)
  // generate with neither prompt nor suffix, chat with no messages: Ollama's "load the model" request, answered
  // done at once.
  bool load_only() const;
};

// Throws ApiError 400 naming the field: malformed JSON, wrong types, values out of range, and fields whose effect
// the server cannot give.
OllamaRequest parse_ollama_request(const std::string& body, bool chat);

using OllamaClock = std::function<std::chrono::system_clock::time_point()>;

// The answer to a load request for one of models: {"model", "created_at", "response": "" (or "message"),
// "done": true, "done_reason": "load"}. Throws ApiError 404 for an unknown model.
nlohmann::json ollama_load_json(const std::vector<OllamaModel>& models, const OllamaRequest& request,
                                const OllamaClock& now);

// Ollama's answer shape: the whole JSON object, or NDJSON lines ("response" / "message" pieces with done: false,
// then one with done: true, done_reason and the counts and durations), {"error": ...} when the generation fails
// after the stream began. model: the name the client used. now: the created_at of each object.
std::unique_ptr<ResponseFormat> ollama_format(bool chat, std::string model, OllamaClock now);

// The plan of a generate or chat request: the specialist (named, or the router's pick for "auto"), the prompt (fill
// in the middle through build_infill_prompt in SPM order with the budget the context leaves, the chat template
// through prepare_generation, or the raw prompt), the limits (num_predict, num_ctx) and the format. Throws ApiError:
// 404 for an unknown model, 400 for a model without the fill-in-the-middle tokens given a suffix, and for a prompt
// longer than the context.
GenerationPlan ollama_plan(const Specialists& specialists, const OllamaRequest& request, int64_t default_max_tokens,
                           OllamaClock now);

}  // namespace slm::server
