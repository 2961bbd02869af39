#pragma once
// How a generation endpoint writes its answer, so that one generation path (http_server.cpp) serves every protocol:
// OpenAI (server-sent events ending in `data: [DONE]`), llama.cpp's /infill (events `data: {...}` with no [DONE]),
// Ollama (newline-delimited JSON). An endpoint's parser turns the request body into a GenerationPlan: what the engine
// runs (PreparedGeneration: the specialist, its engine, the engine::Request), the stop strings, whether to stream,
// and a ResponseFormat made for this one request (it may keep state, e.g. "the first chunk carries the role").
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slm/server/prepare.h"
#include "slm/server/session.h"

namespace slm::server {

class ApiError;

// A generation as far as it has gone: what every protocol reports from it.
struct GenerationReport {
  std::string id;          // this response's id (ResponseFormat::id_prefix() + a unique suffix)
  std::string model;       // who answers: a specialist, or "a+b" for a mixture (also the X-SLM-Specialist header)
  nlohmann::json routing;  // the router's probability per specialist (null when the model was named)
  int64_t created = 0;     // Unix seconds
  // Set once the generation is done (whole(), end()):
  std::string text;           // everything generated (non-streamed answers only; a stream sends it in pieces)
  std::string finish_reason;  // "stop" (a stop id, a stop string or a TextLimit) or "length" (a timeout counts)
  std::string stop_word;      // the stop string that ended it ("": none)
  bool text_limit = false;    // ended by the plan's TextLimit
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens restored from the engine's prefix cache, not computed
  double prompt_s = 0;        // from the request's arrival to its first token (queue and prompt)
  double predicted_s = 0;     // from the first token to the end
};

class ResponseFormat {
 public:
  virtual ~ResponseFormat() = default;
  virtual std::string id_prefix() const = 0;  // "chatcmpl", "cmpl", ...
  // The whole non-streamed answer (sent as application/json).
  virtual nlohmann::json whole(const GenerationReport& r) = 0;
  // The stream's Content-Type and its bytes: one piece of text (non-empty; "" returned writes nothing), then the
  // final event(s) with whatever ends the stream, or, for a generation that failed once streaming began, the error.
  virtual std::string stream_content_type() const { return "text/event-stream"; }
  virtual std::string piece(const GenerationReport& r, const std::string& text) = 0;
  virtual std::string end(const GenerationReport& r) = 0;
  virtual std::string stream_error(const ApiError& e) = 0;
};

// The body of an error answer (before anything was streamed): OpenAI's {"error": {message, type, param, code}} by
// default (ApiError::to_json), {"error": "message"} for Ollama.
using ErrorBody = std::function<nlohmann::json(const ApiError&)>;
nlohmann::json openai_error_body(const ApiError& e);

struct GenerationPlan {
  PreparedGeneration prepared;
  std::vector<std::string> stop;
  bool stream = false;
  TextLimit limit;  // optional (session.h)
  std::unique_ptr<ResponseFormat> format;
  std::string log_note;  // appended to the request's log line (" context: ...")
};

// What a generation endpoint supplies: its request body -> the plan. Throws ApiError for a bad request.
using GenerationParser = std::function<GenerationPlan(const std::string& body)>;

// JSON as the server writes it: invalid UTF-8 (a byte-fallback token on its own) replaced by U+FFFD.
std::string dump_json(const nlohmann::json& j);
// Framings: a server-sent event ("data: {...}\n\n") and a line of newline-delimited JSON ("{...}\n").
std::string sse_event(const nlohmann::json& j);
std::string ndjson_line(const nlohmann::json& j);

}  // namespace slm::server
