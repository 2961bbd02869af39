#include "slm/server/llama_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "slm/server/file_type.h"
#include "slm/server/openai.h"

namespace slm::server {

namespace {

using Json = nlohmann::json;

ApiError bad(const std::string& field, const std::string& message) {
  return ApiError(400, field + ": " + message, field, "invalid_value");
}
ApiError unsupported(const std::string& field, const std::string& message) {
  return ApiError(400, field + ": " + message, field, "unsupported_parameter");
}

Json parse_object(const std::string& body) {
  Json j;
  try {
    j = Json::parse(body);
  } catch (const Json::exception& e) {  // also invalid UTF-8 inside a string
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object", "", "invalid_json");
  return j;
}

bool given(const Json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

std::string string_field(const Json& j, const char* key) {
  if (!given(j, key)) return "";
  if (!j[key].is_string()) throw bad(key, "expected a string");
  return j[key].get<std::string>();
}

// An integer (past int64: saturated, then refused by the range checks).
int64_t int_field(const Json& j, const char* key) {
  if (!j[key].is_number_integer()) throw bad(key, "expected an integer");
  if (j[key].is_number_unsigned())
    return static_cast<int64_t>(std::min<uint64_t>(j[key].get<uint64_t>(), std::numeric_limits<int64_t>::max()));
  return j[key].get<int64_t>();
}

double number_field(const Json& j, const char* key) {
  if (!j[key].is_number()) throw bad(key, "expected a number");
  return j[key].get<double>();
}

bool bool_field(const Json& j, const char* key, bool fallback) {
  if (!given(j, key)) return fallback;
  if (!j[key].is_boolean()) throw bad(key, "expected true or false");
  return j[key].get<bool>();
}

std::vector<std::string> strings_field(const Json& j, const char* key) {
  std::vector<std::string> out;
  if (!given(j, key)) return out;
  if (j[key].is_string()) return {j[key].get<std::string>()};
  if (!j[key].is_array()) throw bad(key, "expected a list of strings");
  for (const auto& x : j[key]) {
    if (!x.is_string()) throw bad(key, "expected a list of strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

// llama.cpp's sampler names (common/sampling.cpp) and what this server does with each. top_k, top_p, temperature
// and penalties are applied; infill is accepted and changes nothing (docs/serving.md says what we do instead). The
// others are accepted only where their parameter (given, or llama.cpp's default) is its no-op value: min_p's default
// 0.05 would change the answer, which this sampler cannot give.
struct NeutralSampler {
  const char* name;
  const char* param;
  double llama_default, neutral;
};
constexpr NeutralSampler kNeutral[] = {{"min_p", "min_p", 0.05, 0.0},
                                       {"typ_p", "typical_p", 1.0, 1.0},
                                       {"xtc", "xtc_probability", 0.0, 0.0},
                                       {"dry", "dry_multiplier", 0.0, 0.0},
                                       {"top_n_sigma", "top_n_sigma", -1.0, -1.0}};
// The chain when a request names none: the samplers we act on, in llama.cpp's order (its default chain also holds
// dry, top_n_sigma, typ_p and xtc at no-op defaults, and min_p at 0.05, which we leave out).
const std::vector<std::string> kDefaultSamplers = {"penalties", "top_k", "top_p", "temperature"};

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

namespace {

// The fields both endpoints read, with their refusals.
void parse_llama_params(const Json& j, LlamaParams& p) {
  p.model = string_field(j, "model");
  if (given(j, "n_predict")) {
    p.n_predict = int_field(j, "n_predict");
    if (p.n_predict < -1) throw bad("n_predict", "must be -1 (up to the context's room), 0 (warm-up) or positive");
  }
  p.stop = strings_field(j, "stop");
  if (given(j, "n_indent")) {
    p.n_indent = int_field(j, "n_indent");
    if (p.n_indent < 0) throw bad("n_indent", "must be 0 or more");
  }
  if (given(j, "t_max_predict_ms")) {
    p.t_max_predict_ms = int_field(j, "t_max_predict_ms");
    if (p.t_max_predict_ms < 0) throw bad("t_max_predict_ms", "must be 0 (none) or more");
  }
  for (const char* key : {"t_max_prompt_ms", "id_slot"})  // accepted; docs/serving.md says why they need nothing
    if (given(j, key)) int_field(j, key);
  p.stream = bool_field(j, "stream", false);
  p.cache_prompt = bool_field(j, "cache_prompt", true);
  p.response_fields = strings_field(j, "response_fields");

  // Sampling: llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95), then its sampler chain decides which
  // apply.
  p.samplers = given(j, "samplers") ? strings_field(j, "samplers") : kDefaultSamplers;
  double temperature = 0.8, top_p = 0.95;
  int64_t top_k = 40;
  if (given(j, "temperature")) {
    temperature = number_field(j, "temperature");
    if (!(temperature >= 0 && temperature <= 2)) throw bad("temperature", "must be in [0, 2]");
  }
  if (given(j, "top_k")) top_k = std::max<int64_t>(int_field(j, "top_k"), 0);  // <= 0: no limit, as llama.cpp
  if (given(j, "top_p")) {
    top_p = number_field(j, "top_p");
    if (!(top_p > 0 && top_p <= 1)) throw bad("top_p", "must be in (0, 1]");
  }
  for (const auto& s : p.samplers) {
    if (s == "top_k" || s == "top_p" || s == "temperature" || s == "penalties" || s == "infill") continue;
    const auto* n = std::find_if(std::begin(kNeutral), std::end(kNeutral), [&](const auto& x) { return s == x.name; });
    if (n == std::end(kNeutral))
      throw unsupported("samplers", "unknown or unsupported sampler \"" + s +
                                        "\" (top_k, top_p, temperature, penalties, infill; min_p, typ_p, xtc, dry, "
                                        "top_n_sigma at their no-op values)");
    const double value = given(j, n->param) ? number_field(j, n->param) : n->llama_default;
    if (value != n->neutral)
      throw unsupported("samplers", "the sampler \"" + s + "\" needs " + n->param + " = " + Json(n->neutral).dump() +
                                        " here (its effect is not implemented)");
  }
  p.sampling.temperature = has(p.samplers, "temperature") ? temperature : 1.0;
  p.sampling.top_k = has(p.samplers, "top_k") ? top_k : 0;
  p.sampling.top_p = has(p.samplers, "top_p") ? top_p : 1.0;
  if (has(p.samplers, "penalties")) {
    if (given(j, "repeat_penalty")) {
      p.sampling.repetition_penalty = number_field(j, "repeat_penalty");
      if (!(p.sampling.repetition_penalty > 0 && p.sampling.repetition_penalty <= 10))
        throw bad("repeat_penalty", "must be in (0, 10]");
    }
    for (auto [key, field] : {std::pair{"presence_penalty", &engine::Sampling::presence_penalty},
                              std::pair{"frequency_penalty", &engine::Sampling::frequency_penalty}})
      if (given(j, key)) {
        p.sampling.*field = number_field(j, key);
        if (!(std::abs(p.sampling.*field) <= 2)) throw bad(key, "must be in [-2, 2]");
      }
  }
  if (given(j, "seed")) {
    const int64_t seed = int_field(j, "seed");
    if (seed != -1 && seed != 0xFFFFFFFF) {  // llama.cpp's "random" (LLAMA_DEFAULT_SEED is 0xFFFFFFFF)
      p.sampling.seed = static_cast<uint64_t>(seed);
      p.random_seed = false;
    }
  }
  // What would change the answer and is not implemented: refused, never ignored.
  if (given(j, "n_probs") && int_field(j, "n_probs") > 0)
    throw unsupported("n_probs", "token probabilities are not supported");
  for (const char* key : {"grammar", "json_schema", "lora", "logit_bias"})
    if (given(j, key) && !(j[key].is_string() && j[key].get<std::string>().empty()) &&
        !(j[key].is_array() && j[key].empty()) && !(j[key].is_object() && j[key].empty()))
      throw unsupported(key, "not supported by this server");
  if (given(j, "mirostat") && int_field(j, "mirostat") != 0) throw unsupported("mirostat", "not supported");
  if (given(j, "n_cmpl")) {
    // llama.vscode sends max_parallel_completions (3 by default) and takes one answer as well as a list of them.
    const int64_t n = int_field(j, "n_cmpl");
    if (n < 1 || n > 4) throw bad("n_cmpl", "must be between 1 and 4");
  }
}

}  // namespace

InfillParams parse_infill_request(const std::string& body) {
  const Json j = parse_object(body);
  InfillParams p;
  // llama.cpp requires both (handle_infill); an editor always sends them, possibly empty.
  for (const char* key : {"input_prefix", "input_suffix"})
    if (!j.contains(key)) throw bad(key, "required: a string (empty at the start or the end of a file)");
  p.infill.prefix = string_field(j, "input_prefix");
  p.infill.suffix = string_field(j, "input_suffix");
  p.infill.prompt = string_field(j, "prompt");
  p.infill.filename = string_field(j, "filename");
  p.workspace = string_field(j, "workspace");
  if (given(j, "input_extra")) {
    const auto& extra = j["input_extra"];
    if (!extra.is_array()) throw bad("input_extra", "expected a list of {\"filename\", \"text\"} chunks");
    for (size_t i = 0; i < extra.size(); ++i) {
      const std::string where = "input_extra[" + std::to_string(i) + "]";
      const auto& c = extra[i];
      if (!c.is_object() || !c.contains("text") || !c["text"].is_string())
        throw bad(where, "expected an object with a string \"text\"");
      if (given(c, "filename") && !c["filename"].is_string()) throw bad(where + ".filename", "expected a string");
      p.infill.extra.push_back({given(c, "filename") ? c["filename"].get<std::string>() : "", c["text"]});
    }
  }
  parse_llama_params(j, p);
  return p;
}

CompletionParams parse_completion_request(const std::string& body) {
  const Json j = parse_object(body);
  CompletionParams p;
  if (!given(j, "prompt")) throw bad("prompt", "required: a string, a list of token ids, or a list of both");
  p.prompt = j["prompt"];
  if (p.prompt.is_array()) {
    size_t strings = 0;
    for (size_t i = 0; i < p.prompt.size(); ++i) {
      const auto& e = p.prompt[i];
      if (e.is_string()) {
        ++strings;
      } else if (!e.is_number_integer()) {
        throw bad("prompt[" + std::to_string(i) + "]", "expected a string or a token id");
      }
    }
    // llama.cpp answers a list of several strings with one completion each; this server answers one prompt.
    if (strings > 1 && strings == p.prompt.size())
      throw unsupported("prompt", "one prompt per request (a list of several strings asks for several completions)");
  } else if (!p.prompt.is_string()) {
    throw bad("prompt", "expected a string, a list of token ids, or a list of both");
  }
  parse_llama_params(j, p);
  return p;
}

Specialist& infill_specialist(const Specialists& specialists, const std::string& model, const std::string& filename,
                              const std::string& text, nlohmann::json& routing) {
  if (!model.empty() && model != "auto")
    if (Specialist* s = specialists.find(model)) return *s;
  std::string type = file_type_of_name(filename);
  if (type.empty()) type = file_type_of_name(model);
  if (type.empty()) type = file_type_of_text(text);
  if (!type.empty()) {
    if (Specialist* s = specialists.find(type)) return *s;
    for (const auto& s : specialists.all())
      if (has(s->routes, type)) return *s;
  }
  if (specialists.has_router()) {
    const auto r = specialists.route(text);
    routing = Json::object();
    for (const auto& [name, prob] : r.probabilities) routing[name] = prob;
    return *specialists.all()[r.specialist];
  }
  if (specialists.all().size() == 1) return *specialists.all()[0];
  throw ApiError(404,
                 "no specialist for this file: name one in \"model\" (GET /v1/models lists them), or load a router",
                 "model", "model_not_found");
}

text::InfillPrompt infill_prompt_for(const Specialist& sp, const text::InfillRequest& request, int64_t budget) {
  try {
    return text::build_infill_prompt(request, text::InfillOrder::Spm, budget, *sp.tokenizer);
  } catch (const Error& e) {
    throw ApiError(400, "the model \"" + sp.name + "\" cannot fill in the middle: " + e.what(), "model",
                   "unsupported_model");
  }
}

std::vector<int64_t> infill_cache_points(const Specialist& sp, const text::InfillPrompt& prompt) {
  std::vector<int64_t> points = {prompt.context_end};
  // In SPM order P (the prefix as kept, then the cursor's line) ends the prompt. The part of P before its last newline
  // is the same from keystroke to keystroke on one line; its tokens are a prefix of P's only when the tokenizer does
  // not merge across that newline, which is checked here rather than assumed.
  const auto n = static_cast<int64_t>(prompt.ids.size());
  const int64_t p_start = n - prompt.prefix_tokens;
  std::vector<uint32_t> p_ids(prompt.ids.begin() + p_start, prompt.ids.end());
  const std::string p_kept = sp.tokenizer->decode(p_ids);
  const size_t nl = p_kept.rfind('\n');
  if (nl == std::string::npos) return points;
  const auto head = sp.tokenizer->encode(std::string_view(p_kept).substr(0, nl + 1));
  if (head.size() < p_ids.size() && std::equal(head.begin(), head.end(), p_ids.begin()))
    points.push_back(p_start + static_cast<int64_t>(head.size()));
  return points;
}

namespace {

// llama.cpp's stop types (server's stop_type_to_str).
std::string stop_type(const GenerationReport& r, bool warm_up) {
  if (warm_up || r.text_limit || r.finish_reason == "length") return "limit";
  if (!r.stop_word.empty()) return "word";
  return "eos";
}

double per_second(int64_t n, double ms) {
  return ms > 0 ? 1e3 * static_cast<double>(n) / ms : 0.0;
}

// llama.cpp's answer to /infill and /completion (server_task_result_cmpl_final/partial, non-OpenAI form).
class LlamaFormat : public ResponseFormat {
 public:
  // context: our "slm_context" field (workspace_context.h), left out when null.
  LlamaFormat(LlamaParams params, std::string id_prefix, std::string prompt, bool truncated, int64_t n_ctx,
              Json context = nullptr)
      : p_(std::move(params)),
        id_prefix_(std::move(id_prefix)),
        prompt_(std::move(prompt)),
        truncated_(truncated),
        n_ctx_(n_ctx),
        context_(std::move(context)) {}
  std::string id_prefix() const override { return id_prefix_; }
  nlohmann::json whole(const GenerationReport& r) override {
    const Json full = final_json(r, warm_up() ? "" : r.text);
    return p_.response_fields.empty() ? full : select_fields(full, p_.response_fields);
  }
  // llama.cpp's stream: one event per piece, then the final object (content already sent); no [DONE].
  std::string piece(const GenerationReport&, const std::string& text) override {
    if (warm_up()) return "";
    return sse_event({{"index", 0}, {"content", text}, {"tokens", Json::array()}, {"stop", false}, {"id_slot", -1}});
  }
  std::string end(const GenerationReport& r) override {
    const Json full = final_json(r, "");
    return sse_event(p_.response_fields.empty() ? full : select_fields(full, p_.response_fields));
  }
  std::string stream_error(const ApiError& e) override { return sse_event(e.to_json()); }

 private:
  bool warm_up() const { return p_.n_predict == 0; }
  Json final_json(const GenerationReport& r, const std::string& content) const {
    const int64_t computed = r.prompt_tokens - r.cached_tokens;
    const double prompt_ms = r.prompt_s * 1e3, predicted_ms = r.predicted_s * 1e3;
    const int64_t predicted = warm_up() ? 0 : r.completion_tokens;
    Json timings = {{"cache_n", r.cached_tokens},
                    {"prompt_n", computed},
                    {"prompt_ms", prompt_ms},
                    {"prompt_per_token_ms", computed > 0 ? prompt_ms / static_cast<double>(computed) : 0.0},
                    {"prompt_per_second", per_second(computed, prompt_ms)},
                    {"predicted_n", predicted},
                    {"predicted_ms", predicted_ms},
                    {"predicted_per_token_ms", predicted > 0 ? predicted_ms / static_cast<double>(predicted) : 0.0},
                    {"predicted_per_second", per_second(predicted, predicted_ms)}};
    Json settings = {{"n_ctx", n_ctx_},
                     {"n_predict", p_.n_predict},
                     {"temperature", p_.sampling.temperature},
                     {"top_k", p_.sampling.top_k},
                     {"top_p", p_.sampling.top_p},
                     {"seed", p_.sampling.seed},
                     {"stop", p_.stop},
                     {"n_indent", p_.n_indent},
                     {"t_max_predict_ms", p_.t_max_predict_ms},
                     {"samplers", p_.samplers},
                     {"stream", p_.stream},
                     {"cache_prompt", p_.cache_prompt}};
    Json out = {{"index", 0},
                {"content", content},
                {"tokens", Json::array()},
                {"id_slot", 0},
                {"stop", true},
                {"model", r.model},
                {"tokens_predicted", predicted},
                {"tokens_evaluated", r.prompt_tokens},
                {"generation_settings", settings},
                {"prompt", prompt_},
                {"has_new_line", content.find('\n') != std::string::npos},
                {"truncated", truncated_},
                {"stop_type", stop_type(r, warm_up())},
                {"stopping_word", r.stop_word},
                {"tokens_cached", r.cached_tokens},
                {"timings", timings}};
    if (!context_.is_null()) out["slm_context"] = context_;
    return out;
  }
  LlamaParams p_;
  std::string id_prefix_, prompt_;
  bool truncated_;
  int64_t n_ctx_;
  Json context_;
};

// llama.cpp's n_indent and t_max_predict_ms (server_context::process_token): once a line has begun after a newline,
// a line whose indentation (spaces and tabs) is below n_indent ends the text at its first other character; and a
// token that brings a newline after t_max_predict_ms since the first token ends it after that token.
TextLimit infill_limit(int64_t n_indent, int64_t t_max_predict_ms) {
  if (n_indent <= 0 && t_max_predict_ms <= 0) return {};
  return [n_indent, t_max_predict_ms](const std::string& text, size_t new_from,
                                      double since_first_s) -> std::optional<size_t> {
    if (n_indent > 0)
      for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', nl + 1)) {
        size_t pos = nl + 1;
        while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t')) ++pos;
        if (pos < text.size() && static_cast<int64_t>(pos - nl - 1) < n_indent) return pos;
      }
    if (t_max_predict_ms > 0 && text.find('\n', new_from) != std::string::npos &&
        since_first_s * 1e3 > static_cast<double>(t_max_predict_ms))
      return text.size();
    return std::nullopt;
  };
}

}  // namespace

GenerationPlan infill_plan(const Specialists& specialists, const std::string& body, int64_t default_max_tokens,
                           const Workspaces& workspaces) {
  InfillParams p = parse_infill_request(body);
  GenerationPlan plan;
  AddedContext added = add_workspace_context(workspaces, p.workspace, p.infill);
  plan.log_note = added.log;
  auto& prep = plan.prepared;
  const std::string text = p.infill.prefix + p.infill.prompt + p.infill.suffix;
  // Without a file name of its own, the newest extra chunk's names the file type (llama.vim's warm-up sends only
  // chunks, and should warm the specialist that will answer the next requests).
  std::string filename = p.infill.filename;
  if (filename.empty() && file_type_of_name(p.model).empty() && file_type_of_text(text).empty())
    for (auto it = p.infill.extra.rbegin(); it != p.infill.extra.rend() && filename.empty(); ++it)
      if (!file_type_of_name(it->filename).empty()) filename = it->filename;
  prep.specialist = &infill_specialist(specialists, p.model, filename, text, prep.routing);
  Specialist& sp = *prep.specialist;
  prep.engine = sp.engine.get();
  prep.answered_by = sp.name;
  const int64_t ctx = prep.engine->context_length();
  // The tokens to generate: n_predict, or (-1) the server's default; a warm-up (0) generates one, not delivered.
  const int64_t n = p.n_predict < 0 ? std::min(default_max_tokens, ctx / 2) : std::max<int64_t>(p.n_predict, 1);
  if (n >= ctx)
    throw ApiError(400,
                   "n_predict: " + std::to_string(p.n_predict) +
                       " leaves no room for a prompt in the model's context of " + std::to_string(ctx) + " tokens",
                   "n_predict", "context_length_exceeded");
  const text::InfillPrompt prompt = infill_prompt_for(sp, p.infill, ctx - n);
  prep.request.prompt = prompt.ids;
  prep.request.max_tokens = p.n_predict < 0 ? ctx - static_cast<int64_t>(prompt.ids.size()) : n;
  prep.request.stop_ids = sp.chat->stop_ids();
  prep.request.sampling = p.sampling;
  if (p.random_seed) prep.request.sampling.seed = std::random_device{}();
  if (p.cache_prompt) prep.request.cache_points = infill_cache_points(sp, prompt);
  plan.stop = p.stop;
  plan.stream = p.stream;
  plan.limit = infill_limit(p.n_indent, p.t_max_predict_ms);
  std::vector<uint32_t> shown(prompt.ids.begin(), prompt.ids.end());
  plan.format = std::make_unique<LlamaFormat>(std::move(p), "infill", sp.tokenizer->decode(shown, true),
                                              prompt.truncated, ctx, std::move(added.debug));
  return plan;
}

GenerationPlan completion_plan(const Specialists& specialists, const std::string& body, int64_t default_max_tokens) {
  CompletionParams p = parse_completion_request(body);
  GenerationPlan plan;
  auto& prep = plan.prepared;
  std::string text;  // what the specialist is chosen by: the prompt's strings
  if (p.prompt.is_string()) text = p.prompt.get<std::string>();
  for (const auto& e : p.prompt.is_array() ? p.prompt : Json::array())
    if (e.is_string()) text += e.get<std::string>();
  prep.specialist = &infill_specialist(specialists, p.model, "", text, prep.routing);
  Specialist& sp = *prep.specialist;
  prep.engine = sp.engine.get();
  prep.answered_by = sp.name;
  const data::Tokenizer& tok = *sp.tokenizer;
  std::vector<int64_t> ids;
  if (p.prompt.is_string()) {
    ids = sp.chat->completion_prompt(text);  // <|bos|> text
  } else {
    for (size_t i = 0; i < p.prompt.size(); ++i) {
      const auto& e = p.prompt[i];
      if (e.is_string()) {
        if (i == 0) ids.push_back(tok.bos_id());
        for (uint32_t id : tok.encode(e.get<std::string>())) ids.push_back(id);
        continue;
      }
      const int64_t id = e.get<int64_t>();
      if (id < 0 || id >= static_cast<int64_t>(tok.vocab_size()))
        throw bad("prompt[" + std::to_string(i) + "]",
                  "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                      std::to_string(tok.vocab_size()) + ")");
      ids.push_back(id);
    }
  }
  const int64_t ctx = prep.engine->context_length(), n = static_cast<int64_t>(ids.size());
  if (n == 0) throw bad("prompt", "must not be empty");
  // The tokens to generate: n_predict, or (-1) the server's default within the room left; 0 fills the cache only.
  const int64_t room = ctx - n;
  const int64_t want = p.n_predict < 0 ? std::min(default_max_tokens, room) : std::max<int64_t>(p.n_predict, 1);
  if (room < 1 || want > room)
    throw ApiError(400,
                   "the prompt is " + std::to_string(n) + " tokens; with n_predict " + std::to_string(want) +
                       " it exceeds the model's context of " + std::to_string(ctx) + " tokens",
                   "prompt", "context_length_exceeded");
  prep.request.prompt = ids;
  prep.request.max_tokens = want;
  prep.request.stop_ids = sp.chat->stop_ids();
  prep.request.sampling = p.sampling;
  if (p.random_seed) prep.request.sampling.seed = std::random_device{}();
  plan.stop = p.stop;
  plan.stream = p.stream;
  plan.limit = infill_limit(p.n_indent, p.t_max_predict_ms);
  std::vector<uint32_t> shown(ids.begin(), ids.end());
  plan.format = std::make_unique<LlamaFormat>(std::move(p), "cmpl", tok.decode(shown, true), false, ctx);
  return plan;
}

nlohmann::json select_fields(const nlohmann::json& full, const std::vector<std::string>& fields) {
  Json out = Json::object();
  for (const auto& path : fields) {
    const Json* at = &full;
    bool found = true;
    size_t start = 0;
    for (;;) {
      const size_t slash = path.find('/', start);
      const std::string key = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      if (!at->is_object() || !at->contains(key)) {
        found = false;
        break;
      }
      at = &(*at)[key];
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    if (found) out[path] = *at;
  }
  return out;
}

namespace {

Specialist& named_or_first(const Specialists& specialists, const Json& j) {
  const std::string model = string_field(j, "model");
  if (model.empty() || model == "auto") return *specialists.all()[0];
  if (Specialist* s = specialists.find(model)) return *s;
  throw ApiError(404, "the model \"" + model + "\" does not exist (GET /v1/models lists them)", "model",
                 "model_not_found");
}

}  // namespace

nlohmann::json tokenize_json(const Specialists& specialists, const std::string& body) {
  const Json j = parse_object(body);
  if (!j.contains("content") || !j["content"].is_string()) throw bad("content", "required: a string");
  const bool add_special = bool_field(j, "add_special", false), with_pieces = bool_field(j, "with_pieces", false);
  const Specialist& sp = named_or_first(specialists, j);
  std::vector<uint32_t> ids = sp.tokenizer->encode(j["content"].get<std::string>());
  if (add_special) ids.insert(ids.begin(), sp.tokenizer->bos_id());
  Json tokens = Json::array();
  for (uint32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    // As llama.cpp: the piece as a string when it is valid UTF-8 on its own, else its bytes.
    const std::string piece = sp.tokenizer->decode({id}, true);
    Json pj;
    try {
      pj = Json::parse(Json(piece).dump());
    } catch (const Json::exception&) {
      pj = Json::array();
      for (unsigned char c : piece) pj.push_back(c);
    }
    tokens.push_back({{"id", id}, {"piece", pj}});
  }
  return {{"tokens", tokens}};
}

nlohmann::json detokenize_json(const Specialists& specialists, const std::string& body) {
  const Json j = parse_object(body);
  if (!j.contains("tokens") || !j["tokens"].is_array()) throw bad("tokens", "required: a list of token ids");
  const Specialist& sp = named_or_first(specialists, j);
  std::vector<uint32_t> ids;
  for (const auto& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= sp.tokenizer->vocab_size())
      throw bad("tokens", "expected ids in [0, " + std::to_string(sp.tokenizer->vocab_size()) + ")");
    ids.push_back(t.get<uint32_t>());
  }
  return {{"content", sp.tokenizer->decode(ids)}};
}

nlohmann::json props_json(const Specialists& specialists, int64_t default_max_tokens) {
  const Specialist& sp = *specialists.all()[0];
  const int64_t ctx = sp.engine->context_length();
  return {{"default_generation_settings",
           {{"n_ctx", ctx},
            {"model", sp.name},
            {"params",
             {{"n_predict", -1},
              {"temperature", 0.8},
              {"top_k", 40},
              {"top_p", 0.95},
              {"samplers", kDefaultSamplers},
              {"default_max_tokens", default_max_tokens}}}}},
          {"total_slots", static_cast<int64_t>(specialists.all().size())},
          {"model_path", sp.weights},
          {"model_alias", sp.name},
          {"modalities", {{"vision", false}, {"audio", false}}},
          {"build_info", "slm serve"},
          {"infill_order", "spm"}};
}

}  // namespace slm::server
