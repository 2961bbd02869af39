#include "slm/server/ollama_api.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <set>

#include "slm/text/infill_prompt.h"
#include "slm/server/llama_api.h"
#include "slm/server/prepare.h"
#include "slm/util/error.h"
#include "slm/util/format.h"
#include "slm/util/sha256.h"

namespace slm::server {

using Json = nlohmann::json;

Json ollama_error_body(const ApiError& e) {
  return {{"error", e.what()}};
}

std::string ollama_time(std::chrono::system_clock::time_point t) {
  const auto since = t.time_since_epoch();
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(since);
  auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(since - secs).count();
  if (nanos < 0) {  // before the epoch: the fraction counts forward from the second below
    secs -= std::chrono::seconds(1);
    nanos += 1000000000;
  }
  const std::time_t tt = static_cast<std::time_t>(secs.count());
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(nanos));
  return buf;
}

namespace {

ApiError bad(const std::string& field, const std::string& message) {
  return ApiError(400, field + ": " + message, field, "invalid_value");
}

ApiError unsupported(const std::string& field, const std::string& why) {
  return ApiError(400, field + ": " + why, field, "unsupported_parameter");
}

bool given(const Json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

std::string string_field(const Json& j, const char* key, const std::string& where) {
  if (!given(j, key)) return "";
  if (!j[key].is_string()) throw bad(where, "expected a string");
  return j[key].get<std::string>();
}

bool bool_field(const Json& j, const char* key, bool fallback, const std::string& where) {
  if (!given(j, key)) return fallback;
  if (!j[key].is_boolean()) throw bad(where, "expected true or false");
  return j[key].get<bool>();
}

// nlohmann keeps integers past int64 as uint64: they saturate rather than wrap negative.
int64_t int_field(const Json& j, const char* key, const std::string& where) {
  const auto& v = j[key];
  if (!v.is_number_integer()) throw bad(where, "expected an integer");
  if (v.is_number_unsigned())
    return static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), std::numeric_limits<int64_t>::max()));
  return v.get<int64_t>();
}

double number_field(const Json& j, const char* key, const std::string& where) {
  if (!j[key].is_number()) throw bad(where, "expected a number");
  const double d = j[key].get<double>();
  if (!std::isfinite(d)) throw bad(where, "expected a finite number");
  return d;
}

// An empty list (or null) is what clients send when they have none; anything in it needs a feature we lack.
void require_empty_list(const Json& j, const char* key, const std::string& where, const std::string& why) {
  if (!given(j, key)) return;
  if (!j[key].is_array()) throw bad(where, "expected a list");
  if (!j[key].empty()) throw unsupported(where, why);
}

// Options that only tune how Ollama loads or runs a model (threads, GPU layers, memory mapping, batch size, the
// tokens kept on a context shift, which never happens here): they do not change the answer.
const std::set<std::string>& no_effect_options() {
  static const std::set<std::string> s = {"numa",
                                          "num_batch",
                                          "num_gpu",
                                          "main_gpu",
                                          "low_vram",
                                          "f16_kv",
                                          "logits_all",
                                          "vocab_only",
                                          "use_mmap",
                                          "use_mlock",
                                          "embedding_only",
                                          "num_thread",
                                          "num_keep",
                                          "penalize_newline",
                                          "num_gqa",
                                          "rope_frequency_base",
                                          "rope_frequency_scale"};
  return s;
}

void parse_options(const Json& o, OllamaRequest& r) {
  if (!o.is_object()) throw bad("options", "expected an object");
  auto& s = r.generation.sampling;
  std::optional<int64_t> repeat_last_n;
  for (const auto& [key, value] : o.items()) {
    const std::string where = "options." + key;
    if (value.is_null() || no_effect_options().count(key)) continue;
    if (key == "num_predict") {
      const int64_t n = int_field(o, "num_predict", where);
      // Ollama: -1 (its default) generates until a stop, -2 until the context is full; a limit below 1 is no
      // limit. Here every one of them runs until a stop or the context's end.
      if (n > 0) r.generation.max_tokens = n;
      r.predict_to_context = n <= 0;
    } else if (key == "num_ctx") {
      const int64_t n = int_field(o, "num_ctx", where);
      if (n < 1) throw bad(where, "must be at least 1");
      r.num_ctx = n;
    } else if (key == "temperature") {
      s.temperature = number_field(o, "temperature", where);
      if (s.temperature < 0) throw bad(where, "must be >= 0");
    } else if (key == "top_p") {
      s.top_p = number_field(o, "top_p", where);
      if (!(s.top_p > 0 && s.top_p <= 1)) throw bad(where, "must be in (0, 1]");
    } else if (key == "top_k") {
      s.top_k = std::max<int64_t>(int_field(o, "top_k", where), 0);  // 0 or less: no limit, as llama.cpp
    } else if (key == "seed") {
      // Ollama's -1 is "random": the default seed stays.
      const int64_t seed = int_field(o, "seed", where);
      if (seed >= 0) s.seed = static_cast<uint64_t>(seed);
    } else if (key == "repeat_penalty") {
      s.repetition_penalty = number_field(o, "repeat_penalty", where);
      if (!(s.repetition_penalty > 0 && s.repetition_penalty <= 10)) throw bad(where, "must be in (0, 10]");
    } else if (key == "presence_penalty" || key == "frequency_penalty") {
      const double v = number_field(o, key.c_str(), where);
      if (!(std::abs(v) <= 2)) throw bad(where, "must be in [-2, 2]");
      (key == "presence_penalty" ? s.presence_penalty : s.frequency_penalty) = v;
    } else if (key == "repeat_last_n") {
      repeat_last_n = int_field(o, "repeat_last_n", where);
    } else if (key == "stop") {
      r.generation.stop.clear();
      if (value.is_string()) {
        r.generation.stop.push_back(value.get<std::string>());
      } else if (value.is_array()) {
        for (const auto& x : value) {
          if (!x.is_string()) throw bad(where, "expected a string or a list of strings");
          r.generation.stop.push_back(x.get<std::string>());
        }
      } else {
        throw bad(where, "expected a string or a list of strings");
      }
      // An empty stop string would end every generation before its first character.
      std::erase(r.generation.stop, std::string());
    } else if (key == "min_p" || key == "typical_p" || key == "tfs_z") {
      // Samplers this server does not have: their neutral value (no filtering) is accepted.
      const double neutral = key == "min_p" ? 0.0 : 1.0, v = number_field(o, key.c_str(), where);
      if (v != neutral)
        throw unsupported(where, "this sampler is not supported (only " + std::to_string(static_cast<int>(neutral)) +
                                     ", which disables it)");
    } else if (key == "mirostat") {
      if (int_field(o, "mirostat", where) != 0) throw unsupported(where, "Mirostat sampling is not supported (only 0)");
    } else if (key == "mirostat_tau" || key == "mirostat_eta") {
      number_field(o, key.c_str(), where);  // used by Mirostat only, which is off
    } else {
      throw unsupported(where, "unknown option (docs/serving.md lists the options this server takes)");
    }
  }
  // The penalties here cover the whole prompt and output (repeat) or the whole output (presence, frequency): that is
  // repeat_last_n -1. 0 switches them off, as in Ollama; another window would give other answers.
  if (repeat_last_n && *repeat_last_n != -1) {
    const bool neutral = s.repetition_penalty == 1 && s.presence_penalty == 0 && s.frequency_penalty == 0;
    if (*repeat_last_n == 0) {
      s.repetition_penalty = 1;
      s.presence_penalty = s.frequency_penalty = 0;
    } else if (!neutral) {
      throw unsupported("options.repeat_last_n",
                        "penalties over only the last " + std::to_string(*repeat_last_n) +
                            " tokens are not supported: -1 (the whole context, what this server does) or 0 (off)");
    }
  }
}

std::string file_time(const std::string& path) {
  struct stat st {};
  if (path == "random" || ::stat(path.c_str(), &st) != 0) return ollama_time({});  // random weights: the epoch
  return ollama_time(std::chrono::system_clock::time_point(std::chrono::seconds(st.st_mtim.tv_sec) +
                                                           std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
}

bool has_fim_tokens(const data::Tokenizer& tok) {
  try {
    text::infill_tokens(tok);
    return true;
  } catch (const Error&) {
    return false;
  }
}

Json details_json(const OllamaModel& m) {
  return {{"parent_model", ""},
          {"format", "safetensors"},
          {"family", "slm"},
          {"families", {"slm"}},
          {"parameter_size", human_count(m.parameters)},
          {"quantization_level", m.quantization}};
}

const OllamaModel& find_model(const std::vector<OllamaModel>& models, const std::string& name) {
  const std::string n = ollama_model_name(name);
  for (const auto& m : models)
    if (m.name == n) return m;
  throw ApiError(404, "model '" + name + "' not found (GET /api/tags lists them)", "model", "model_not_found");
}

}  // namespace

std::string ollama_model_name(const std::string& name) {
  const std::string tag = ":latest";
  return name.size() > tag.size() && name.ends_with(tag) ? name.substr(0, name.size() - tag.size()) : name;
}

std::vector<OllamaModel> ollama_models(const Specialists& specialists) {
  std::vector<OllamaModel> out;
  for (const auto& s : specialists.all()) {
    OllamaModel m;
    m.name = s->name;
    m.description = s->description;
    m.size = s->weight_bytes;
    m.parameters = s->parameters;
    m.quantization = s->nvfp4_bytes > 0 ? "NVFP4" : s->weight_bytes >= 4 * s->parameters ? "F32" : "BF16";
    m.modified_at = file_time(s->weights);
    // Names the weights without reading them: hashing a checkpoint of hundreds of MB per /api/tags would cost
    // seconds, and clients only compare digests for equality.
    m.digest = sha256_hex(s->name + "\n" + s->weights + "\n" + std::to_string(s->weight_bytes) + "\n" + m.modified_at);
    m.context_length = s->engine->context_length();
    m.vocab_size = s->engine->vocab_size();
    m.insert = has_fim_tokens(*s->tokenizer);
    out.push_back(std::move(m));
  }
  if (specialists.has_router() || specialists.all().size() == 1) {
    OllamaModel a;
    a.name = "auto";
    a.description = "the router picks the specialist for each request";
    a.quantization = out.front().quantization;
    a.modified_at = out.front().modified_at;
    a.context_length = out.front().context_length;
    a.insert = true;
    std::string digests;
    for (const auto& m : out) {
      a.size += m.size;
      a.parameters += m.parameters;
      if (m.quantization != a.quantization) a.quantization = "mixed";
      a.modified_at = std::max(a.modified_at, m.modified_at);           // same-width timestamps order as text
      a.context_length = std::min(a.context_length, m.context_length);  // what any pick can take
      a.vocab_size = std::max(a.vocab_size, m.vocab_size);
      a.insert = a.insert && m.insert;
      digests += m.digest;
    }
    a.digest = sha256_hex(digests);
    out.push_back(std::move(a));
  }
  return out;
}

Json ollama_tags_json(const std::vector<OllamaModel>& models) {
  Json list = Json::array();
  for (const auto& m : models)
    list.push_back({{"name", m.name},
                    {"model", m.name},
                    {"modified_at", m.modified_at},
                    {"size", m.size},
                    {"digest", m.digest},
                    {"details", details_json(m)}});
  return {{"models", list}};
}

Json ollama_ps_json(const std::vector<OllamaModel>& models) {
  Json list = Json::array();
  for (const auto& m : models) {
    if (m.name == "auto") continue;  // not a model in memory of its own
    // Specialists stay loaded for the server's life: no expiry (Ollama's keep_alive -1 shows a far date too).
    list.push_back({{"name", m.name},
                    {"model", m.name},
                    {"size", m.size},
                    {"digest", m.digest},
                    {"details", details_json(m)},
                    {"expires_at", "9999-12-31T23:59:59Z"},
                    {"context_length", m.context_length}});
  }
  return {{"models", list}};
}

std::string ollama_template(bool insert) {
  // The chat turn as text/chat_template.h builds it; the fill-in-the-middle prompt as build_infill_prompt builds
  // it in SPM order without extra chunks or a file name (the suffix first, then the text before the cursor, which
  // the model continues).
  const std::string turn =
      "<|bos|>{{ if .System }}<|system|>{{ .System }}<|end|>{{ end }}<|user|>{{ .Prompt }}<|end|><|assistant|>";
  if (!insert) return turn;
  return "{{- if .Suffix }}<|bos|><|fim_prefix|><|fim_suffix|>{{ .Suffix }}<|fim_middle|>{{ .Prompt }}{{- else }}" +
         turn + "{{- end }}";
}

Json ollama_show_json(const std::vector<OllamaModel>& models, const std::string& body) {
  Json j;
  try {
    j = Json::parse(body);
  } catch (const Json::exception& e) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object", "", "invalid_json");
  // "name" is the field's older spelling, which Continue still sends.
  std::string name = string_field(j, "model", "model");
  if (name.empty()) name = string_field(j, "name", "name");
  if (name.empty()) throw bad("model", "required: a model name (GET /api/tags lists them)");
  const OllamaModel& m = find_model(models, name);
  const std::string tmpl = ollama_template(m.insert);
  // One "key value" per line with no empty line: Continue reads num_ctx from here with a pattern that every line
  // must match.
  char params[256];
  std::snprintf(params, sizeof(params), "%-30s %lld\n%-30s %d\n%-30s %d\n%-30s %d\n%-30s %d", "num_ctx",
                static_cast<long long>(m.context_length), "temperature", 1, "top_p", 1, "top_k", 0, "repeat_penalty",
                1);
  const std::string modelfile = "# Modelfile of slm serve's model \"" + m.name + "\" (" + m.description + ")\nFROM " +
                                m.name + "\nTEMPLATE \"\"\"" + tmpl + "\"\"\"\nPARAMETER num_ctx " +
                                std::to_string(m.context_length);
  Json caps = {"completion"};
  if (m.insert) caps.push_back("insert");
  return {{"modelfile", modelfile},
          {"parameters", params},
          {"template", tmpl},
          {"details", details_json(m)},
          {"model_info",
           {{"general.architecture", "slm"},
            {"general.parameter_count", m.parameters},
            {"slm.context_length", m.context_length},
            {"slm.vocab_size", m.vocab_size}}},
          {"capabilities", caps},
          {"modified_at", m.modified_at}};
}

bool OllamaRequest::load_only() const {
  return chat ? generation.messages.empty() : generation.prompt.empty() && suffix.empty();
}

OllamaRequest parse_ollama_request(const std::string& body, bool chat) {
  Json j;
  try {
    j = Json::parse(body);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number like 1e400
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object", "", "invalid_json");
  OllamaRequest r;
  r.chat = chat;
  r.model = string_field(j, "model", "model");
  if (r.model.empty()) throw bad("model", "model is required (GET /api/tags lists the models)");
  r.generation.chat = chat;
  r.generation.model = ollama_model_name(r.model);
  r.generation.stream = bool_field(j, "stream", true, "stream");  // Ollama streams unless told not to
  if (given(j, "options")) parse_options(j["options"], r);
  if (given(j, "keep_alive") && !j["keep_alive"].is_string() && !j["keep_alive"].is_number())
    throw bad("keep_alive", "expected a duration (\"5m\") or a number of seconds");
  bool_field(j, "truncate", true, "truncate");  // a prompt too long for the context is refused either way
  bool_field(j, "shift", true, "shift");        // the context never shifts: generation ends at the context's end

  // What the server cannot do, refused when asked for.
  if (given(j, "format") && j["format"] != "")
    throw unsupported("format", "structured output (\"json\" or a JSON schema) is not supported by this server");
  if (given(j, "think") && j["think"] != false)
    throw unsupported("think", "'" + r.model + "' does not support thinking");
  if (bool_field(j, "logprobs", false, "logprobs")) throw unsupported("logprobs", "not supported by this server");
  if (given(j, "top_logprobs") && int_field(j, "top_logprobs", "top_logprobs") != 0)
    throw unsupported("top_logprobs", "not supported by this server");
  for (const char* key : {"width", "height", "steps"})
    if (given(j, key)) throw unsupported(key, "image generation is not supported by this server");

  if (chat) {
    require_empty_list(j, "tools", "tools", "tool calling is not supported by this server");
    if (given(j, "messages") && !j["messages"].is_array()) throw bad("messages", "expected a list of messages");
    const Json messages = given(j, "messages") ? j["messages"] : Json::array();
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) throw bad(where, "expected an object with \"role\" and \"content\"");
      const std::string role = string_field(m, "role", where + ".role");
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        throw bad(where + ".role", "expected system, user, assistant or tool (got \"" + role + "\")");
      require_empty_list(m, "images", where + ".images", "images are not supported by this server");
      require_empty_list(m, "tool_calls", where + ".tool_calls", "tool calls are not supported by this server");
      string_field(m, "thinking", where + ".thinking");  // an earlier turn's reasoning: not part of the prompt
      string_field(m, "tool_name", where + ".tool_name");
      r.generation.messages.push_back({role, string_field(m, "content", where + ".content")});
    }
  } else {
    r.generation.prompt = string_field(j, "prompt", "prompt");
    r.suffix = string_field(j, "suffix", "suffix");
    r.system = string_field(j, "system", "system");
    r.raw = bool_field(j, "raw", false, "raw");
    require_empty_list(j, "images", "images", "images are not supported by this server");
    if (given(j, "template") && j["template"] != "")
      throw unsupported("template",
                        "a prompt template of the request's own is not supported (POST /api/show gives "
                        "the one the server uses)");
    if (given(j, "context") && !(j["context"].is_array() && j["context"].empty()))
      throw unsupported("context",
                        "the deprecated context tokens are not supported (use /api/chat for a "
                        "conversation)");
    if (r.raw && !r.system.empty())
      throw ApiError(400, "raw mode does not support template, system, or context", "raw", "invalid_value");
    if (!r.suffix.empty() && !r.system.empty())
      throw unsupported("system", "a fill-in-the-middle prompt (with a suffix) has no place for a system message");
  }
  return r;
}

Json ollama_load_json(const std::vector<OllamaModel>& models, const OllamaRequest& r, const OllamaClock& now) {
  find_model(models, r.model);
  Json j = {{"model", r.model}, {"created_at", ollama_time(now())}};
  if (r.chat)
    j["message"] = {{"role", "assistant"}, {"content", ""}};
  else
    j["response"] = "";
  j["done"] = true;
  j["done_reason"] = "load";
  return j;
}

namespace {

class OllamaFormat : public ResponseFormat {
 public:
  OllamaFormat(bool chat, std::string model, OllamaClock now) : chat_(chat), model_(std::move(model)), now_(now) {}
  std::string id_prefix() const override { return chat_ ? "ollama-chat" : "ollama-generate"; }
  Json whole(const GenerationReport& r) override { return final_json(r, r.text); }
  std::string stream_content_type() const override { return "application/x-ndjson"; }
  std::string piece(const GenerationReport&, const std::string& text) override {
    Json j = head(text);
    j["done"] = false;
    return ndjson_line(j);
  }
  std::string end(const GenerationReport& r) override { return ndjson_line(final_json(r, "")); }
  std::string stream_error(const ApiError& e) override { return ndjson_line(ollama_error_body(e)); }

 private:
  Json head(const std::string& text) const {
    Json j = {{"model", model_}, {"created_at", ollama_time(now_())}};
    if (chat_)
      j["message"] = {{"role", "assistant"}, {"content", text}};
    else
      j["response"] = text;
    return j;
  }
  Json final_json(const GenerationReport& r, const std::string& text) const {
    auto ns = [](double s) { return static_cast<int64_t>(std::llround(s * 1e9)); };
    Json j = head(text);
    j["done"] = true;
    j["done_reason"] = r.finish_reason;
    j["total_duration"] = ns(r.prompt_s + r.predicted_s);
    j["load_duration"] = 0;  // the specialists are loaded when the server starts
    j["prompt_eval_count"] = r.prompt_tokens;
    j["prompt_eval_duration"] = ns(r.prompt_s);
    j["eval_count"] = r.completion_tokens;
    j["eval_duration"] = ns(r.predicted_s);
    return j;
  }
  bool chat_;
  std::string model_;
  OllamaClock now_;
};

// num_ctx may ask for less context than the model has, never for more.
void check_num_ctx(const OllamaRequest& r, const engine::Engine& e) {
  if (r.num_ctx && *r.num_ctx > e.context_length())
    throw ApiError(400,
                   "options.num_ctx (" + std::to_string(*r.num_ctx) + ") is more than the model's context of " +
                       std::to_string(e.context_length()) + " tokens",
                   "num_ctx", "context_length_exceeded");
}

// A fill-in-the-middle request through the infill pieces of llama_api.h (the specialist of the text's file type for
// "auto", the SPM prompt and its cache points), in the budget that num_predict leaves of the context (num_ctx's when
// smaller than the model's).
PreparedGeneration prepare_infill(const Specialists& specialists, const OllamaRequest& r, int64_t default_max_tokens) {
  PreparedGeneration p;
  if (r.generation.model == "auto-2")
    throw ApiError(400,
                   "model 'auto-2' (two specialists decoding together) does not fill in the middle: name a "
                   "specialist or \"auto\"",
                   "model", "unsupported_model");
  if (r.generation.model != "auto" && !specialists.find(r.generation.model))
    throw ApiError(404, "model '" + r.model + "' not found (GET /api/tags lists them)", "model", "model_not_found");
  Specialist& sp = infill_specialist(specialists, r.generation.model, "", r.generation.prompt + r.suffix, p.routing);
  p.specialist = &sp;
  p.engine = sp.engine.get();
  p.answered_by = sp.name;
  check_num_ctx(r, *p.engine);
  const int64_t ctx = r.num_ctx.value_or(p.engine->context_length());
  const int64_t max_tokens = r.generation.max_tokens.value_or(std::min(default_max_tokens, ctx / 2));
  // The prompt gets what the generation leaves of the context; it is trimmed to that, never refused for its length.
  if (max_tokens >= ctx)
    throw ApiError(400,
                   "num_predict (" + std::to_string(max_tokens) + ") leaves no room for the prompt in the context of " +
                       std::to_string(ctx) + " tokens",
                   "num_predict", "context_length_exceeded");
  text::InfillRequest fill;
  fill.prefix = r.generation.prompt;
  fill.suffix = r.suffix;
  const auto prompt = infill_prompt_for(sp, fill, ctx - max_tokens);
  const auto n = static_cast<int64_t>(prompt.ids.size());
  p.request.prompt = prompt.ids;
  p.request.cache_points = infill_cache_points(sp, prompt);
  p.request.sampling = r.generation.sampling;
  p.request.max_tokens = r.predict_to_context ? ctx - n : max_tokens;
  p.request.stop_ids = sp.chat->stop_ids();
  return p;
}

}  // namespace

std::unique_ptr<ResponseFormat> ollama_format(bool chat, std::string model, OllamaClock now) {
  return std::make_unique<OllamaFormat>(chat, std::move(model), std::move(now));
}

GenerationPlan ollama_plan(const Specialists& specialists, const OllamaRequest& r, int64_t default_max_tokens,
                           OllamaClock now) {
  GenerationPlan plan;
  if (!r.suffix.empty()) {
    plan.prepared = prepare_infill(specialists, r, default_max_tokens);
  } else {
    const std::string& name = r.generation.model;
    if (name != "auto" && name != "auto-2" && !specialists.find(name))
      throw ApiError(404, "model '" + r.model + "' not found (GET /api/tags lists them)", "model", "model_not_found");
    GenerationRequest g = r.generation;
    if (!r.chat && !r.raw) {  // Ollama's generate without raw: the prompt as the user's turn of a chat
      g.chat = true;
      if (!r.system.empty()) g.messages.push_back({"system", r.system});
      g.messages.push_back({"user", r.generation.prompt});
    }
    try {
      // num_predict <= 0: a default as large as the context, which prepare_generation caps at the context left.
      plan.prepared = prepare_generation(
          specialists, g, r.predict_to_context ? std::numeric_limits<int64_t>::max() : default_max_tokens);
    } catch (const ApiError& e) {
      if (e.param() != "max_tokens") throw;
      std::string m = e.what();  // the limit's Ollama name
      const std::string openai_name = "max_tokens";
      if (const size_t at = m.find(openai_name); at != std::string::npos)
        m.replace(at, openai_name.size(), "num_predict");
      throw ApiError(e.status(), m, "num_predict", e.code());
    }
    check_num_ctx(r, *plan.prepared.engine);
    if (r.num_ctx) {  // a smaller context than the model's: the prompt and the generation must fit it
      auto& q = plan.prepared.request;
      const auto n = static_cast<int64_t>(q.prompt.size());
      if (n >= *r.num_ctx)
        throw ApiError(
            400, "the prompt is " + std::to_string(n) + " tokens, and options.num_ctx is " + std::to_string(*r.num_ctx),
            "num_ctx", "context_length_exceeded");
      if (q.max_tokens > *r.num_ctx - n) {
        if (r.generation.max_tokens)
          throw ApiError(400,
                         "the prompt (" + std::to_string(n) + " tokens) plus num_predict (" +
                             std::to_string(q.max_tokens) + ") exceeds options.num_ctx (" + std::to_string(*r.num_ctx) +
                             ")",
                         "num_predict", "context_length_exceeded");
        q.max_tokens = *r.num_ctx - n;
      }
    }
  }
  plan.stop = r.generation.stop;
  plan.stream = r.generation.stream;
  plan.format = ollama_format(r.chat, r.model, std::move(now));
  return plan;
}

}  // namespace slm::server
