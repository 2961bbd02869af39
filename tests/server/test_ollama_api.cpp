// server/ollama_api.h: Ollama's request bodies and answers, without HTTP. The bodies are the examples of ollama/ollama
// docs/api.md, and those that the `ollama` Python client (0.6.3's model_dump) and Continue's Ollama provider
// (core/llm/llms/Ollama.ts) send; the expected answers are written out by hand from the same document. The plans are
// checked against prompt ids built here from the 512-id tokenizer (its control ids, tokenizer/README.md: <|bos|> 2,
// <|eos|> 3, <|system|> 4, <|user|> 5, <|assistant|> 6, <|end|> 9, <|fim_prefix|> 10, <|fim_suffix|> 11,
// <|fim_middle|> 12).
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "serving_test_util.h"
#include "slm/server/ollama_api.h"
#include "slm/util/format.h"

namespace slm::server {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int64_t>;

constexpr int64_t kContext = 40;

// 2023-08-04T19:22:45.499127455Z: 1691176965 s after the epoch (calendar.timegm), and the nanoseconds.
std::chrono::system_clock::time_point fixed_time() {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(1691176965499127455LL)));
}
const OllamaClock kClock = [] { return fixed_time(); };
const std::string kTime = "2023-08-04T19:22:45.499127455Z";

Ids encode(const std::string& text) {
  const auto ids = test::code512().encode(text);
  return Ids(ids.begin(), ids.end());
}
Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// A refused body: its status and the field it names.
void expect_refused(const std::string& body, bool chat, const std::string& param, int status = 400) {
  try {
    parse_ollama_request(body, chat);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status) << body << ": " << e.what();
    EXPECT_EQ(e.param(), param) << body << ": " << e.what();
    EXPECT_EQ(ollama_error_body(e), Json({{"error", e.what()}}));
  }
}

TEST(OllamaApi, TimestampsAreRfc3339InUtcWithNanoseconds) {
  EXPECT_EQ(ollama_time(fixed_time()), kTime);
  EXPECT_EQ(ollama_time({}), "1970-01-01T00:00:00.000000000Z");
}

TEST(OllamaApi, GenerateExamplesOfTheDocs) {
  // "Generate request (Streaming)": stream is not given, and Ollama streams.
  auto r = parse_ollama_request(R"({"model": "llama3.2", "prompt": "Why is the sky blue?"})", false);
  EXPECT_EQ(r.model, "llama3.2");
  EXPECT_EQ(r.generation.prompt, "Why is the sky blue?");
  EXPECT_TRUE(r.generation.stream);
  EXPECT_FALSE(r.load_only());
  EXPECT_FALSE(r.generation.max_tokens.has_value());

  // "Request (with suffix)".
  r = parse_ollama_request(R"({"model": "codellama:code", "prompt": "def compute_gcd(a, b):",
    "suffix": "    return result", "options": {"temperature": 0}, "stream": false})",
                           false);
  EXPECT_EQ(r.generation.model, "codellama:code");  // only the default tag is dropped
  EXPECT_EQ(r.generation.prompt, "def compute_gcd(a, b):");
  EXPECT_EQ(r.suffix, "    return result");
  EXPECT_EQ(r.generation.sampling.temperature, 0.0);
  EXPECT_FALSE(r.generation.stream);

  // "Request (Raw Mode)", "Reproducible outputs", "Load a model".
  r = parse_ollama_request(R"({"model": "mistral", "prompt": "[INST] why is the sky blue? [/INST]", "raw": true,
    "stream": false})",
                           false);
  EXPECT_TRUE(r.raw);
  r = parse_ollama_request(R"({"model": "mistral", "prompt": "Why is the sky blue?", "options": {"seed": 123}})",
                           false);
  EXPECT_EQ(r.generation.sampling.seed, 123u);
  EXPECT_TRUE(parse_ollama_request(R"({"model": "llama3.2"})", false).load_only());
  EXPECT_TRUE(parse_ollama_request(R"({"model": "llama3.2", "keep_alive": 0})", false).load_only());
  // A cursor at the start of a file: no prompt, but a suffix to fill before.
  EXPECT_FALSE(parse_ollama_request(R"({"model": "m", "suffix": "int x;"})", false).load_only());
}

TEST(OllamaApi, TheDocsEveryOptionExampleIsRefusedForItsSamplersAndAcceptedWithout) {
  // "Generate request (With options)": every option Ollama has. Mirostat 1 and typical_p 0.7 ask for samplers this
  // server lacks, repeat_last_n 33 for a penalty window it lacks.
  Json body = Json::parse(R"({"model": "llama3.2", "prompt": "Why is the sky blue?", "stream": false, "options": {
    "num_keep": 5, "seed": 42, "num_predict": 100, "top_k": 20, "top_p": 0.9, "min_p": 0.0, "typical_p": 0.7,
    "repeat_last_n": 33, "temperature": 0.8, "repeat_penalty": 1.2, "presence_penalty": 1.5,
    "frequency_penalty": 1.0, "mirostat": 1, "mirostat_tau": 0.8, "mirostat_eta": 0.6, "penalize_newline": true,
    "stop": ["\n", "user:"], "numa": false, "num_ctx": 1024, "num_batch": 2, "num_gpu": 1, "main_gpu": 0,
    "low_vram": false, "vocab_only": false, "use_mmap": true, "use_mlock": false, "num_thread": 8}})");
  expect_refused(body.dump(), false, "options.mirostat");
  body["options"]["mirostat"] = 0;
  expect_refused(body.dump(), false, "options.typical_p");
  body["options"]["typical_p"] = 1.0;
  expect_refused(body.dump(), false, "options.repeat_last_n");
  body["options"]["repeat_last_n"] = -1;
  const auto r = parse_ollama_request(body.dump(), false);
  EXPECT_EQ(r.generation.sampling.seed, 42u);
  EXPECT_EQ(r.generation.max_tokens, 100);
  EXPECT_EQ(r.generation.sampling.top_k, 20);
  EXPECT_DOUBLE_EQ(r.generation.sampling.top_p, 0.9);
  EXPECT_DOUBLE_EQ(r.generation.sampling.temperature, 0.8);
  EXPECT_DOUBLE_EQ(r.generation.sampling.repetition_penalty, 1.2);
  EXPECT_DOUBLE_EQ(r.generation.sampling.presence_penalty, 1.5);
  EXPECT_DOUBLE_EQ(r.generation.sampling.frequency_penalty, 1.0);
  EXPECT_EQ(r.generation.stop, (std::vector<std::string>{"\n", "user:"}));
  EXPECT_EQ(r.num_ctx, 1024);
  EXPECT_FALSE(r.generation.stream);
}

TEST(OllamaApi, BodiesAsTheClientsSendThem) {
  // The ollama client's generate(model, prompt, suffix=..., options=...) and chat(..., stream=True).
  auto r = parse_ollama_request(
      R"({"model": "m", "stream": false, "options": {"num_predict": 3, "temperature": 0, "seed": 1}, "prompt": "p",
      "suffix": "s"})",
      false);
  EXPECT_EQ(r.generation.max_tokens, 3);
  EXPECT_EQ(r.suffix, "s");
  r = parse_ollama_request(
      R"({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}], "tools": []})", true);
  ASSERT_EQ(r.generation.messages.size(), 1u);
  EXPECT_EQ(r.generation.messages[0].role, "user");
  EXPECT_EQ(r.generation.messages[0].content, "x");
  EXPECT_TRUE(r.generation.stream);
  // Continue's autocomplete (_streamFim: _getGenerateOptions with raw, the model file's options, keep_alive 1800 s).
  r = parse_ollama_request(R"({"model": "cpp:latest", "prompt": "int main() {\n  ", "suffix": "\n}\n", "raw": true,
    "options": {"temperature": 0.01, "num_predict": 256, "stop": ["\n\n", "<|end|>"], "num_ctx": 1024},
    "keep_alive": 1800, "stream": true})",
                           false);
  EXPECT_EQ(r.generation.model, "cpp");
  EXPECT_EQ(r.model, "cpp:latest");
  EXPECT_TRUE(r.raw);
  EXPECT_EQ(r.generation.stop.size(), 2u);
  // Chat's "Load a model"; a chat with an assistant turn and a system message.
  EXPECT_TRUE(parse_ollama_request(R"({"model": "llama3.2", "messages": []})", true).load_only());
  r = parse_ollama_request(R"({"model": "m", "messages": [{"role": "system", "content": "be brief"},
    {"role": "user", "content": "why?"}, {"role": "assistant", "content": "because", "images": null},
    {"role": "user", "content": "how?", "images": []}], "format": "", "think": false})",
                           true);
  EXPECT_EQ(r.generation.messages.size(), 4u);
  EXPECT_EQ(r.generation.messages[2].content, "because");
}

TEST(OllamaApi, WhatTheServerCannotDoIsRefusedNamingTheField) {
  expect_refused(R"({"prompt": "x"})", false, "model");
  expect_refused(R"({"model": "m", "prompt": "x", "format": "json"})", false, "format");
  expect_refused(R"({"model": "m", "prompt": "x", "format": {"type": "object"}})", false, "format");
  expect_refused(R"({"model": "m", "prompt": "x", "images": ["iVBORw0KGgo="]})", false, "images");
  expect_refused(R"({"model": "m", "prompt": "x", "think": true})", false, "think");
  expect_refused(R"({"model": "m", "prompt": "x", "raw": true, "system": "s"})", false, "raw");
  expect_refused(R"({"model": "m", "prompt": "x", "suffix": "y", "system": "s"})", false, "system");
  expect_refused(R"({"model": "m", "prompt": "x", "template": "{{ .Prompt }}"})", false, "template");
  expect_refused(R"({"model": "m", "prompt": "x", "context": [1, 2, 3]})", false, "context");
  expect_refused(R"({"model": "m", "prompt": "x", "logprobs": true})", false, "logprobs");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"nonsense": 1}})", false, "options.nonsense");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"min_p": 0.05}})", false, "options.min_p");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"tfs_z": 0.5}})", false, "options.tfs_z");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"repeat_last_n": 64, "repeat_penalty": 1.1}})", false,
                 "options.repeat_last_n");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"num_ctx": 0}})", false, "options.num_ctx");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"top_p": 0}})", false, "options.top_p");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"temperature": -1}})", false, "options.temperature");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"num_predict": "5"}})", false, "options.num_predict");
  expect_refused(R"({"model": "m", "prompt": "x", "options": {"stop": [1]}})", false, "options.stop");
  expect_refused(R"({"model": "m", "prompt": "x", "options": [1]})", false, "options");
  expect_refused(R"({"model": "m", "prompt": 5})", false, "prompt");
  expect_refused(R"({"model": "m", "prompt": "x", "stream": "yes"})", false, "stream");
  expect_refused(R"({"model": "m", "prompt": "x", "keep_alive": [1]})", false, "keep_alive");
  expect_refused(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
    "function": {"name": "f"}}]})",
                 true, "tools");
  expect_refused(R"({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})", true,
                 "messages[0].images");
  expect_refused(R"({"model": "m", "messages": [{"role": "assistant", "content": "",
    "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]})",
                 true, "messages[0].tool_calls");
  expect_refused(R"({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})", true, "messages[0].role");
  expect_refused(R"({"model": "m", "messages": {"role": "user"}})", true, "messages");
  expect_refused("not json", false, "");
  expect_refused("[1]", true, "");
}

TEST(OllamaApi, NeutralValuesOfMissingSamplersAndPredictionLimits) {
  auto r = parse_ollama_request(
      R"({"model": "m", "prompt": "x", "options": {"min_p": 0, "typical_p": 1, "tfs_z": 1, "mirostat": 0,
      "mirostat_tau": 5, "repeat_last_n": 64, "num_predict": -1, "top_k": -1, "seed": -1}})",
      false);
  EXPECT_TRUE(r.predict_to_context);
  EXPECT_FALSE(r.generation.max_tokens.has_value());
  EXPECT_EQ(r.generation.sampling.top_k, 0);  // no limit
  EXPECT_EQ(r.generation.sampling.seed, engine::Sampling{}.seed);
  // repeat_last_n 0 switches the penalties off.
  r = parse_ollama_request(
      R"({"model": "m", "prompt": "x", "options": {"repeat_last_n": 0, "repeat_penalty": 1.3, "presence_penalty": 1}})",
      false);
  EXPECT_EQ(r.generation.sampling.repetition_penalty, 1.0);
  EXPECT_EQ(r.generation.sampling.presence_penalty, 0.0);
  // An empty stop string would stop everything at once: dropped.
  r = parse_ollama_request(R"({"model": "m", "prompt": "x", "options": {"stop": ["", "}"]}})", false);
  EXPECT_EQ(r.generation.stop, std::vector<std::string>{"}"});
}

GenerationReport report() {
  GenerationReport r;
  r.text = "The sky is blue.";
  r.finish_reason = "stop";
  r.prompt_tokens = 26;
  r.completion_tokens = 5;
  r.prompt_s = 0.5;
  r.predicted_s = 1.25;
  return r;
}

// One NDJSON line: the object, then a newline, nothing else.
Json line(const std::string& bytes) {
  EXPECT_FALSE(bytes.empty());
  EXPECT_EQ(bytes.back(), '\n');
  EXPECT_EQ(bytes.find('\n'), bytes.size() - 1) << bytes;
  return Json::parse(bytes);
}

TEST(OllamaApi, GenerateAnswersAsTheDocsShowThem) {
  auto f = ollama_format(false, "llama3.2", kClock);
  EXPECT_EQ(f->stream_content_type(), "application/x-ndjson");
  EXPECT_EQ(line(f->piece(report(), "The")), Json::parse(R"({"model": "llama3.2", "created_at": ")" + kTime +
                                                         R"(", "response": "The", "done": false})"));
  const Json final_stats = Json::parse(R"({"done": true, "done_reason": "stop", "total_duration": 1750000000,
    "load_duration": 0, "prompt_eval_count": 26, "prompt_eval_duration": 500000000, "eval_count": 5,
    "eval_duration": 1250000000})");
  Json end = final_stats;
  end["model"] = "llama3.2";
  end["created_at"] = kTime;
  end["response"] = "";
  EXPECT_EQ(line(f->end(report())), end);
  Json whole = end;
  whole["response"] = "The sky is blue.";
  EXPECT_EQ(f->whole(report()), whole);
  EXPECT_EQ(line(f->stream_error(ApiError(500, "generation failed: boom"))),
            Json::parse(R"({"error": "generation failed: boom"})"));
}

TEST(OllamaApi, ChatAnswersAsTheDocsShowThem) {
  auto f = ollama_format(true, "llama3.2", kClock);
  EXPECT_EQ(line(f->piece(report(), "The")), Json::parse(R"({"model": "llama3.2", "created_at": ")" + kTime +
                                                         R"(", "message": {"role": "assistant", "content": "The"},
      "done": false})"));
  const Json whole = Json::parse(R"({"model": "llama3.2", "created_at": ")" + kTime + R"(",
    "message": {"role": "assistant", "content": "The sky is blue."}, "done": true, "done_reason": "stop",
    "total_duration": 1750000000, "load_duration": 0, "prompt_eval_count": 26, "prompt_eval_duration": 500000000,
    "eval_count": 5, "eval_duration": 1250000000})");
  EXPECT_EQ(f->whole(report()), whole);
  Json end = whole;
  end["message"]["content"] = "";
  EXPECT_EQ(line(f->end(report())), end);
}

class OllamaModels : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::single_threaded();
    solo_ = new Specialists();
    solo_->add(
        "only", test::serving_model(31, kContext),
        std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model"))),
        {"cmake"}, LoadOptions{});
  }
  static void TearDownTestSuite() { delete solo_; }
  static inline Specialists* solo_ = nullptr;
};

TEST_F(OllamaModels, TagsListEachSpecialistAndAuto) {
  const Specialist& s = *solo_->all()[0];
  const Json tags = ollama_tags_json(ollama_models(*solo_));
  ASSERT_EQ(tags["models"].size(), 2u);
  const Json& m = tags["models"][0];
  EXPECT_EQ(m["name"], "only");
  EXPECT_EQ(m["model"], "only");
  EXPECT_EQ(m["size"], s.weight_bytes);
  EXPECT_EQ(m["modified_at"], "1970-01-01T00:00:00.000000000Z");  // random weights: no file
  EXPECT_TRUE(std::regex_match(m["digest"].get<std::string>(), std::regex("[0-9a-f]{64}")));
  EXPECT_EQ(m["details"]["format"], "safetensors");
  EXPECT_EQ(m["details"]["family"], "slm");
  EXPECT_EQ(m["details"]["quantization_level"], "F32");  // the micro model's float32 weights
  EXPECT_EQ(m["details"]["parameter_size"], human_count(s.parameters));
  const Json& a = tags["models"][1];
  EXPECT_EQ(a["name"], "auto");
  EXPECT_EQ(a["size"], s.weight_bytes);
  EXPECT_NE(a["digest"], m["digest"]);
  const Json ps = ollama_ps_json(ollama_models(*solo_));
  ASSERT_EQ(ps["models"].size(), 1u);
  EXPECT_EQ(ps["models"][0]["context_length"], kContext);
}

TEST_F(OllamaModels, LoadRequestsAreAnsweredDoneAtOnce) {
  const auto models = ollama_models(*solo_);
  EXPECT_EQ(ollama_load_json(models, parse_ollama_request(R"({"model": "only"})", false), kClock),
            Json::parse(R"({"model": "only", "created_at": ")" + kTime +
                        R"(", "response": "", "done": true, "done_reason": "load"})"));
  EXPECT_EQ(ollama_load_json(models, parse_ollama_request(R"({"model": "auto", "messages": []})", true), kClock),
            Json::parse(R"({"model": "auto", "created_at": ")" + kTime +
                        R"(", "message": {"role": "assistant", "content": ""}, "done_reason": "load", "done": true})"));
  EXPECT_THROW(ollama_load_json(models, parse_ollama_request(R"({"model": "nope"})", false), kClock), ApiError);
}

TEST_F(OllamaModels, ShowGivesATemplateWithSuffixAndParametersContinueCanRead) {
  const auto models = ollama_models(*solo_);
  for (const char* body : {R"({"model": "only"})", R"({"name": "only:latest"})"}) {
    const Json show = ollama_show_json(models, body);
    const std::string tmpl = show["template"];
    EXPECT_NE(tmpl.find(".Suffix"), std::string::npos) << tmpl;
    EXPECT_NE(tmpl.find("<|bos|><|fim_prefix|><|fim_suffix|>{{ .Suffix }}<|fim_middle|>{{ .Prompt }}"),
              std::string::npos)
        << tmpl;
    EXPECT_EQ(show["capabilities"], Json::parse(R"(["completion", "insert"])"));
    EXPECT_EQ(show["model_info"]["slm.context_length"], kContext);
    EXPECT_EQ(show["model_info"]["slm.vocab_size"], 512);
    EXPECT_EQ(show["details"]["family"], "slm");
    // Continue's constructor reads every line with this pattern (a line that fails it ends its reading, and FIM
    // stays off), and takes num_ctx from it.
    const std::regex continue_line(R"(^(\S+)\s+((?:".*")|\S+)$)");
    const std::string params = show["parameters"];
    size_t start = 0;
    bool num_ctx = false;
    while (start <= params.size()) {
      const size_t end = std::min(params.find('\n', start), params.size());
      const std::string l = params.substr(start, end - start);
      std::smatch m;
      EXPECT_TRUE(std::regex_match(l, m, continue_line)) << "\"" << l << "\"";
      if (m.size() == 3 && m[1] == "num_ctx") num_ctx = m[2] == std::to_string(kContext);
      start = end + 1;
    }
    EXPECT_TRUE(num_ctx) << params;
  }
  try {
    ollama_show_json(models, R"({"model": "nope"})");
    ADD_FAILURE() << "an unknown model was shown";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(std::string(e.what()), "model 'nope' not found (GET /api/tags lists them)");
  }
  EXPECT_THROW(ollama_show_json(models, "{}"), ApiError);
}

TEST_F(OllamaModels, FillInTheMiddlePromptsAreSpmWithTheirCachePoints) {
  auto r = parse_ollama_request(
      R"({"model": "only", "prompt": "int f() {", "suffix": "}\n", "options": {"num_predict": 4}})", false);
  const auto plan = ollama_plan(*solo_, r, 16, kClock);
  const Ids suffix = encode("}\n"), prefix = encode("int f() {");
  EXPECT_EQ(plan.prepared.request.prompt, cat({{2, 10, 11}, suffix, {12}, prefix}));
  EXPECT_EQ(plan.prepared.request.max_tokens, 4);
  EXPECT_EQ(plan.prepared.request.cache_points, Ids{1});  // after <|bos|>: the prefix has no line of its own
  EXPECT_EQ(plan.prepared.request.stop_ids, (Ids{9, 3}));
  EXPECT_EQ(plan.prepared.answered_by, "only");
  EXPECT_TRUE(plan.stream);
  EXPECT_EQ(plan.format->stream_content_type(), "application/x-ndjson");
  // raw changes nothing when there is a suffix; "auto" with a lone specialist is that one; num_predict -1 fills the
  // context.
  r = parse_ollama_request(
      R"({"model": "auto", "prompt": "int f() {", "suffix": "}\n", "raw": true, "options": {"num_predict": -1}})",
      false);
  const auto all = ollama_plan(*solo_, r, 16, kClock);
  EXPECT_EQ(all.prepared.request.prompt, plan.prepared.request.prompt);
  EXPECT_EQ(all.prepared.request.max_tokens, kContext - static_cast<int64_t>(plan.prepared.request.prompt.size()));
  // A prefix longer than the context is trimmed to the room num_predict leaves, never refused.
  r = parse_ollama_request(R"({"model": "only", "suffix": "}", "options": {"num_predict": 8}})", false);
  r.generation.prompt = std::string(200, 'x') + "\n" + "int g() {";
  const auto trimmed = ollama_plan(*solo_, r, 16, kClock);
  EXPECT_LE(static_cast<int64_t>(trimmed.prepared.request.prompt.size()), kContext - 8);
  const Ids kept = encode("int g() {");
  EXPECT_TRUE(std::equal(kept.rbegin(), kept.rend(), trimmed.prepared.request.prompt.rbegin()));
}

TEST_F(OllamaModels, GenerateWithoutSuffixIsTheChatTurnOrRaw) {
  auto r = parse_ollama_request(R"({"model": "only:latest", "prompt": "hello", "system": "brief"})", false);
  auto plan = ollama_plan(*solo_, r, 16, kClock);
  EXPECT_EQ(plan.prepared.request.prompt, cat({{2, 4}, encode("brief"), {9, 5}, encode("hello"), {9, 6}}));
  EXPECT_EQ(plan.prepared.request.max_tokens, 16);
  r = parse_ollama_request(R"({"model": "only", "prompt": "hello", "raw": true})", false);
  plan = ollama_plan(*solo_, r, 16, kClock);
  EXPECT_EQ(plan.prepared.request.prompt, cat({{2}, encode("hello")}));
  r = parse_ollama_request(R"({"model": "only", "messages": [{"role": "user", "content": "hello"}]})", true);
  plan = ollama_plan(*solo_, r, 16, kClock);
  EXPECT_EQ(plan.prepared.request.prompt, test::user_prompt("hello"));
  const auto n = static_cast<int64_t>(plan.prepared.request.prompt.size());
  // num_predict -1: the whole context left; num_ctx caps it; more than the model's context is refused.
  r = parse_ollama_request(
      R"({"model": "only", "messages": [{"role": "user", "content": "hello"}], "options": {"num_predict": -1}})", true);
  EXPECT_EQ(ollama_plan(*solo_, r, 16, kClock).prepared.request.max_tokens, kContext - n);
  r.num_ctx = n + 3;
  EXPECT_EQ(ollama_plan(*solo_, r, 16, kClock).prepared.request.max_tokens, 3);
  auto refused = [&](OllamaRequest q, int status, const std::string& param, const std::string& what) {
    try {
      ollama_plan(*solo_, q, 16, kClock);
      ADD_FAILURE() << "planned";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), status) << e.what();
      EXPECT_EQ(e.param(), param) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  r.num_ctx = kContext + 1;
  refused(r, 400, "num_ctx", "more than the model's context of 40 tokens");
  r.num_ctx = n;
  refused(r, 400, "num_ctx", "options.num_ctx is");
  r.num_ctx.reset();
  r.predict_to_context = false;
  r.generation.max_tokens = kContext;
  refused(r, 400, "num_predict", "num_predict (40)");
  r.generation.model = "nope";
  r.model = "nope:7b";
  refused(r, 404, "model", "model 'nope:7b' not found");
  r.suffix = "x";
  refused(r, 404, "model", "model 'nope:7b' not found");
}

}  // namespace
}  // namespace slm::server
