#include "slm/server/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace slm::server {

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  if (status_ == 401) return "authentication_error";
  if (status_ == 404) return "not_found_error";
  if (status_ == 429 || status_ == 503) return "server_overloaded";
  if (status_ >= 500) return "server_error";
  return "invalid_request_error";
}

nlohmann::json ApiError::to_json() const {
  return {{"error",
           {{"message", what()},
            {"type", type()},
            {"param", param_.empty() ? nlohmann::json() : nlohmann::json(param_)},
            {"code", code_.empty() ? nlohmann::json() : nlohmann::json(code_)}}}};
}

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError(400, param + ": " + message, param, "invalid_value");
}

// Message content: a string, or a list of {"type": "text", "text": ...} parts joined (null for an assistant turn
// that only called tools).
std::string message_content(const nlohmann::json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) throw bad(where, "expected a string or a list of text parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const auto& part = c[i];
    const std::string pw = where + "[" + std::to_string(i) + "]";
    // Compared, not value("type", ""): that throws for a "type" that is not a string (an internal error, 500).
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw bad(pw, "only {\"type\": \"text\", \"text\": \"...\"} parts are supported");
    out += part["text"].get<std::string>();
  }
  return out;
}

// An integer field. nlohmann keeps integers past int64 as uint64; they saturate here rather than wrap negative.
int64_t integer(const nlohmann::json& j, const std::string& key) {
  if (!j[key].is_number_integer()) throw bad(key, "expected an integer");
  if (j[key].is_number_unsigned())
    return static_cast<int64_t>(std::min<uint64_t>(j[key].get<uint64_t>(), std::numeric_limits<int64_t>::max()));
  return j[key].get<int64_t>();
}

double number(const nlohmann::json& j, const std::string& key) {
  if (!j[key].is_number()) throw bad(key, "expected a number");
  return j[key].get<double>();
}

}  // namespace

std::string GenerationRequest::routing_text() const {
  if (!chat) return prompt;
  for (auto it = messages.rbegin(); it != messages.rend(); ++it)
    if (it->role == "user") return it->content;
  return messages.empty() ? "" : messages.back().content;
}

GenerationRequest parse_generation_request(const std::string& body, bool chat) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object", "", "invalid_json");
  GenerationRequest r;
  r.chat = chat;
  if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
    throw bad("model", "required: a model name (GET /v1/models lists them)");
  r.model = j["model"].get<std::string>();
  if (chat) {
    if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
      throw bad("messages", "required: a non-empty list of messages");
    for (size_t i = 0; i < j["messages"].size(); ++i) {
      const auto& m = j["messages"][i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw bad(where, "expected an object with a string \"role\"");
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
        throw bad(where + ".role", "unknown role \"" + role + "\" (system, developer, user, assistant, tool)");
      if (!m.contains("content")) throw bad(where + ".content", "required");
      r.messages.push_back({role, message_content(m["content"], where + ".content")});
    }
    if (j.contains("files") && !j["files"].is_null()) {
      if (!j["files"].is_array()) throw bad("files", "expected a list of file paths of the server's workspaces");
      for (size_t i = 0; i < j["files"].size(); ++i) {
        if (!j["files"][i].is_string()) throw bad("files[" + std::to_string(i) + "]", "expected a string");
        r.files.push_back(j["files"][i].get<std::string>());
      }
    }
  } else {
    if (!j.contains("prompt")) throw bad("prompt", "required: a string");
    const auto& p = j["prompt"];
    if (p.is_string())
      r.prompt = p.get<std::string>();
    else if (p.is_array() && p.size() == 1 && p[0].is_string())
      r.prompt = p[0].get<std::string>();
    else
      throw bad("prompt", "expected a string (or a list of exactly one string; token-id prompts are not supported)");
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (j.contains(key) && !j[key].is_null()) {
      // Past int64 no context holds it: refused here, where the value is still known (read as int64 it would wrap
      // negative). Smaller ones meet the context check in prepare_generation.
      if (j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
        throw ApiError(400, std::string(key) + ": " + j[key].dump() + " is more tokens than any model's context", key,
                       "context_length_exceeded");
      const int64_t v = integer(j, key);
      if (v < 1) throw bad(key, "must be at least 1");
      r.max_tokens = v;
    }
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    r.sampling.temperature = number(j, "temperature");
    if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2)) throw bad("temperature", "must be in [0, 2]");
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    r.sampling.top_p = number(j, "top_p");
    if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) throw bad("top_p", "must be in (0, 1]");
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {  // vLLM's and llama.cpp's extension; -1 or 0: no limit
    const int64_t k = integer(j, "top_k");
    if (k < -1) throw bad("top_k", "must be -1 or 0 (no limit) or positive");
    r.sampling.top_k = std::max<int64_t>(k, 0);
  }
  for (auto [key, field] : {std::pair{"presence_penalty", &engine::Sampling::presence_penalty},
                            std::pair{"frequency_penalty", &engine::Sampling::frequency_penalty}})
    if (j.contains(key) && !j[key].is_null()) {
      r.sampling.*field = number(j, key);
      if (!(std::abs(r.sampling.*field) <= 2)) throw bad(key, "must be in [-2, 2]");
    }
  if (j.contains("repetition_penalty") && !j["repetition_penalty"].is_null()) {  // vLLM's extension
    r.sampling.repetition_penalty = number(j, "repetition_penalty");
    if (!(r.sampling.repetition_penalty > 0 && r.sampling.repetition_penalty <= 10))
      throw bad("repetition_penalty", "must be in (0, 10]");
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) throw bad("seed", "expected an integer");
    r.sampling.seed = static_cast<uint64_t>(j["seed"].get<int64_t>());
  }
  if (j.contains("n") && !j["n"].is_null()) {
    if (integer(j, "n") != 1) throw bad("n", "only n = 1 is supported");
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const auto& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) throw bad("stop", "expected a string or a list of up to 4 strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad("stop", "expected a string or a list of up to 4 strings");
    }
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) throw bad("stream", "expected true or false");
    r.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const auto& so = j["stream_options"];
    if (!so.is_object()) throw bad("stream_options", "expected an object");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) throw bad("stream_options.include_usage", "expected true or false");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  // Features this server does not have: refused when asked for, rather than silently ignored.
  for (const char* key : {"logprobs", "echo"})
    if (j.contains(key) && !j[key].is_null() && j[key] != false && j[key] != 0)
      throw ApiError(400, std::string(key) + ": not supported by this server", key, "unsupported_parameter");
  if (!chat && j.contains("suffix") && !j["suffix"].is_null()) {  // on chat: refused below
    if (!j["suffix"].is_string()) throw bad("suffix", "expected a string");
    r.suffix = j["suffix"].get<std::string>();
  }
  for (const char* key : {"tools", "functions", "best_of", "suffix", "top_logprobs", "response_format"})
    if (j.contains(key) && !j[key].is_null() && !(key == std::string("best_of") && j[key] == 1) &&
        !(key == std::string("suffix") && !chat) &&
        !(key == std::string("response_format") && j[key].is_object() && j[key].contains("type") &&
          j[key]["type"] == "text"))
      throw ApiError(400, std::string(key) + ": not supported by this server", key, "unsupported_parameter");
  return r;
}

namespace {

nlohmann::json usage(const Completion& c) {
  return {{"prompt_tokens", c.prompt_tokens},
          {"completion_tokens", c.completion_tokens},
          {"total_tokens", c.prompt_tokens + c.completion_tokens}};
}

nlohmann::json envelope(const Completion& c, const char* object) {
  // No system_fingerprint: OpenAI's schema types it as a string when present, and there is no backend
  // configuration fingerprint to report beyond the model and specialist names.
  nlohmann::json j = {
      {"id", c.id}, {"object", object}, {"created", c.created}, {"model", c.model}, {"specialist", c.specialist}};
  if (!c.routing.is_null()) j["routing"] = c.routing;
  return j;
}

}  // namespace

nlohmann::json completion_json(const Completion& c, bool chat) {
  auto j = envelope(c, chat ? "chat.completion" : "text_completion");
  if (chat)
    j["choices"] = {
        {{"index", 0},
         {"message", {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}}},  // refusal: required
         {"logprobs", nullptr},
         {"finish_reason", c.finish_reason}}};
  else
    j["choices"] = {{{"index", 0}, {"text", c.text}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason}}};
  j["usage"] = usage(c);
  return j;
}

nlohmann::json chunk_json(const Completion& c, bool chat, const std::string& delta, bool first, bool final,
                          bool usage_only) {
  auto j = envelope(c, chat ? "chat.completion.chunk" : "text_completion");
  const nlohmann::json finish = final ? nlohmann::json(c.finish_reason) : nlohmann::json();
  if (usage_only) {
    j["choices"] = nlohmann::json::array();
    j["usage"] = usage(c);
  } else if (chat) {
    nlohmann::json d = nlohmann::json::object();
    if (first) d["role"] = "assistant";
    if (!final) d["content"] = delta;
    j["choices"] = {{{"index", 0}, {"delta", d}, {"logprobs", nullptr}, {"finish_reason", finish}}};
  } else {
    j["choices"] = {{{"index", 0}, {"text", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}};
  }
  return j;
}

}  // namespace slm::server
