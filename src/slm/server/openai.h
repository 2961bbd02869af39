#pragma once
// The OpenAI request and response shapes the server speaks (POST /v1/chat/completions, POST /v1/completions):
// parsing with per-field errors, and the JSON of responses, stream chunks and errors. No HTTP, no models.
//
// Accepted fields: model, messages (chat) / prompt (completions: a string or a list of one string), max_tokens (or
// max_completion_tokens), temperature [0, 2], top_p (0, 1], presence_penalty and frequency_penalty [-2, 2], seed,
// n (only 1), stop (a string or up to 4), stream, stream_options.include_usage, suffix (completions: the prompt is
// the text before the insertion, suffix the text after; the answer is what goes between); and vLLM's top_k (-1 or 0:
// none) and repetition_penalty (0, 10]. Other fields are ignored, as OpenAI-compatible servers do, except those whose
// effect this server cannot give (logprobs, tools, ...) when set to a non-default value: those are refused, so a
// client never gets silently different behaviour.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "slm/text/chat_template.h"
#include "slm/engine/engine.h"

namespace slm::server {

// An error as the client sees it: HTTP status and OpenAI's {"error": {message, type, param, code}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // "invalid_request_error" (4xx), "authentication_error" (401), "not_found_error" (404), "server_error" (5xx)...
  std::string type() const;
  nlohmann::json to_json() const;

 private:
  int status_;
  std::string param_, code_;
};

struct GenerationRequest {
  bool chat = true;
  std::string model;
  std::vector<text::ChatMessage> messages;  // chat
  std::string prompt;                         // completions
  std::optional<std::string> suffix;          // completions: the text after the insertion (fill-in-the-middle)
  std::optional<int64_t> max_tokens;
  engine::Sampling sampling;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  std::vector<std::string> files;  // chat, our extension: files of the server's workspaces the messages are about
  // The text the router reads: the last user message (chat) or the prompt.
  std::string routing_text() const;
};

// Throws ApiError (400) naming the field for malformed JSON, wrong types and values out of range.
GenerationRequest parse_generation_request(const std::string& body, bool chat);

struct Completion {
  std::string id, model, specialist;
  int64_t created = 0;
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
  nlohmann::json routing;  // the router's probabilities by specialist (null when the model was named)
};

// The whole non-streamed response (chat.completion / text_completion).
nlohmann::json completion_json(const Completion& c, bool chat);
// One server-sent-event chunk: delta text (chat: the first chunk also carries the role), or the final chunk
// with finish_reason (text empty), or the usage chunk (usage_only).
nlohmann::json chunk_json(const Completion& c, bool chat, const std::string& delta, bool first, bool final,
                          bool usage_only = false);

}  // namespace slm::server
