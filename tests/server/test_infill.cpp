// llama.cpp's POST /infill on slm serve, as editors send it: the requests llama.vim (autoload/llama.vim, s:fim and
// the ring-buffer warm-up) and llama.vscode (src/llama-server.ts, createRequestPayload) build, field for field; the
// response fields they read (flattened response_fields as llama.cpp's json_get_nested_values); n_indent and
// t_max_predict_ms as llama.cpp's server applies them (process_token), on a scripted engine whose text and timing the
// test sets; the budget (an over-long request trimmed, never refused); the prefix cache while a user types a line on
// a tiny hybrid model; which specialist answers; malformed requests; the README's curl line, run as it stands;
// POST /completion, as Continue's llama.cpp provider sends it; and the context graph of a workspace (issue 45) in the
// prompt, the response's slm_context, the log and /metrics.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "data/data_test_util.h"
#include "engine/engine_test_util.h"
#include "serving_test_util.h"
#include "slm/server/http_server.h"
#include "slm/server/llama_api.h"
#include "test_server_util.h"

namespace slm::server {
namespace {

using Json = nlohmann::json;

// The hybrid of the batch engine's tests (attention, Mamba-3, M2RNN, MoE, Engram, mHC) in a context of 256 tokens:
// its recurrent layers are why a cache must restore states rather than rewind.
std::shared_ptr<model::HybridLM> hybrid_model(uint64_t seed) {
  std::ifstream file(test::source_path("recipes/tiny-full.json"));
  auto j = Json::parse(file);
  j["seq_len"] = 256;
  j["pattern"] = "AEMFAEMR";
  j["depth"] = 8;
  j["attention"]["dsa_enabled"] = false;
  j["attention"].erase("mla_layers");
  j["attention"].erase("mla");
  j["mtp"]["mla"] = false;
  j["engram"]["layers"] = {0, 4};
  j["mhc"]["layers"] = {0, 1, 2, 3};
  auto m = std::make_shared<model::HybridLM>(parse_recipe_text(j.dump(), "infill-hybrid.json"));
  test::randomize(*m, seed);
  m->eval();
  return m;
}

// An engine that answers every request with the same tokens, each after its own delay from the first token (the
// test's clock, not a race: the delay is a deadline the engine waits for). It keeps the last request for checks.
class ScriptedEngine final : public engine::Engine {
 public:
  struct Step {
    int64_t token;
    std::chrono::milliseconds after_first{0};
  };
  ScriptedEngine(std::vector<Step> steps, int64_t context) : steps_(std::move(steps)), context_(context) {}
  ~ScriptedEngine() override {
    for (auto& t : threads_) t.join();
  }
  engine::RequestId submit(engine::Request request, engine::Callbacks cb) override {
    std::lock_guard lock(mu_);
    last_ = request;
    const engine::RequestId id = ++next_;
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    cancelled_[id] = cancelled;
    threads_.emplace_back([this, cb = std::move(cb), cancelled, max = request.max_tokens, n = request.prompt.size()] {
      engine::Result r;
      r.prompt_tokens = static_cast<int64_t>(n);
      r.finish = engine::Finish::kLength;
      const auto first = std::chrono::steady_clock::now();
      for (const auto& s : steps_) {
        if (r.completion_tokens == max) break;
        if (*cancelled) {
          r.finish = engine::Finish::kCancelled;
          break;
        }
        std::this_thread::sleep_until(first + s.after_first);
        cb.on_token(s.token);
        ++r.completion_tokens;
      }
      if (r.finish != engine::Finish::kCancelled && *cancelled) r.finish = engine::Finish::kCancelled;
      cb.on_done(r);
    });
    return id;
  }
  void cancel(engine::RequestId id) override {
    std::lock_guard lock(mu_);
    if (auto it = cancelled_.find(id); it != cancelled_.end()) *it->second = true;
  }
  engine::Stats stats() const override { return {}; }
  int64_t context_length() const override { return context_; }
  int64_t vocab_size() const override { return 512; }
  engine::Request last() {
    std::lock_guard lock(mu_);
    return last_;
  }

 private:
  std::vector<Step> steps_;
  int64_t context_;
  std::mutex mu_;
  engine::Request last_;
  engine::RequestId next_ = 0;
  std::map<engine::RequestId, std::shared_ptr<std::atomic<bool>>> cancelled_;
  std::vector<std::thread> threads_;
};

// The steps spelling `text` in code512's tokens, all at once.
std::vector<ScriptedEngine::Step> spell(const std::string& text) {
  std::vector<ScriptedEngine::Step> out;
  for (uint32_t id : test::code512().encode(text)) out.push_back({id});
  return out;
}

std::unique_ptr<data::Tokenizer> tokenizer() {
  return std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model")));
}

class Infill : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::single_threaded();
    specialists_ = new Specialists();
    auto hybrid = hybrid_model(7);
    specialists_->add("cpp", hybrid, tokenizer(), {"cpp"}, LoadOptions{});
    LoadOptions no_cache;
    no_cache.prefix_cache_mib = 0;  // the reference for the cached answers: the same weights, nothing restored
    specialists_->add("cpp-uncached", hybrid, tokenizer(), {}, no_cache);
    specialists_->add("shell", test::serving_model(43, 512), tokenizer(), {"shell"}, LoadOptions{});
    specialists_->add("scripted", test::serving_model(44, 512), tokenizer(), {}, LoadOptions{});
    ServerOptions so;
    so.port = 0;
    so.threads = 8;
    server_ = new Server(*specialists_, so);
    port_ = server_->start();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete specialists_;
  }
  // Installs a scripted engine on the "scripted" specialist for one test.
  static ScriptedEngine& script(std::vector<ScriptedEngine::Step> steps) {
    auto& s = *specialists_->find("scripted");
    auto e = std::make_unique<ScriptedEngine>(std::move(steps), 512);
    ScriptedEngine& ref = *e;
    s.engine = std::move(e);
    return ref;
  }
  static httplib::Result post(const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120);
    return c.Post(path.c_str(), body, "application/json");
  }
  static Json post_ok(const std::string& path, const Json& body, std::string* specialist = nullptr) {
    auto r = post(path, body.dump());
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    if (specialist) *specialist = r->get_header_value("X-SLM-Specialist");
    return Json::parse(r->body);
  }
  static inline Specialists* specialists_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
};

// The events of a llama.cpp stream, each line `data: {...}` (a line of another form fails the test).
std::vector<Json> sse_events(const std::string& body) {
  std::vector<Json> events;
  std::istringstream lines(body);
  for (std::string l; std::getline(lines, l);) {
    if (l.empty()) continue;
    EXPECT_EQ(l.rfind("data: ", 0), 0u) << l;
    if (l.rfind("data: ", 0) == 0) events.push_back(Json::parse(l.substr(6)));
  }
  return events;
}

// A C++ file around the cursor, the way llama.vim cuts it: the lines before the cursor's line (joined by "\n", with
// the newline that ends the last), the cursor's line up to the cursor, and the rest.
const std::string kPrefix = "#include <vector>\n\nint sum(const std::vector<int>& v) {\n";
const std::string kSuffix = "\n  return total;\n}\n";

// llama.vim's s:fim request (autoload/llama.vim at a1c8e6e, 2026-01-31) with its defaults: n_predict 128, stop_strings
// [], t_max_prompt_ms 500, t_max_predict_ms 250 (the first request of a position), top_k 40, top_p 0.90, samplers
// top_k/top_p/infill, id_slot 0, and "model": "" (its check len("g:llama_config.model_fim") tests the literal, so the
// field is always there). input_extra chunks are {text, time (reltime()), filename}.
TEST_F(Infill, LlamaVimRequestAsSent) {
  const Json request = Json::parse(R"({
    "id_slot": 0,
    "input_prefix": "#include <vector>\n\nint sum(const std::vector<int>& v) {\n",
    "input_suffix": "\n  return total;\n}\n",
    "input_extra": [{"text": "int product(int a, int b) {\n  return a * b;\n}\n", "time": [1735689600, 123456],
                     "filename": "src/math.cpp"}],
    "prompt": "  int total = ",
    "n_predict": 128,
    "stop": [],
    "n_indent": 2,
    "top_k": 40,
    "top_p": 0.90,
    "samplers": ["top_k", "top_p", "infill"],
    "stream": false,
    "cache_prompt": true,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 250,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                        "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"],
    "model": ""
  })");
  std::string who;
  const Json r = post_ok("/infill", request, &who);
  // Only the fields asked for, keyed by their flattened names, as llama.cpp answers.
  std::set<std::string> keys;
  for (const auto& [k, v] : r.items()) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{
                      "content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                      "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                      "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"}));
  EXPECT_TRUE(r["content"].is_string());
  EXPECT_EQ(r["truncated"], false);
  EXPECT_TRUE(r["timings/prompt_n"].is_number_integer());
  EXPECT_TRUE(r["tokens_cached"].is_number_integer());
  EXPECT_GE(r["timings/predicted_n"].get<int64_t>(), 0);
  EXPECT_LE(r["timings/predicted_n"].get<int64_t>(), 128);
  EXPECT_EQ(who, "cpp");  // no model named: the C++ in the text picks the cpp specialist
}

// llama.vim's warm-up after a chunk enters its ring buffer (s:ring_update): n_predict 0, response_fields [""]. It only
// fills the cache; the answer has no field (the empty path leads nowhere).
TEST_F(Infill, LlamaVimWarmUp) {
  const Json request = Json::parse(R"({
    "id_slot": 0, "input_prefix": "", "input_suffix": "",
    "input_extra": [{"text": "int product(int a, int b) {\n  return a * b;\n}\n", "time": [1735689600, 5],
                     "filename": "src/math.cpp"}],
    "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": false, "cache_prompt": true,
    "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""], "model": ""
  })");
  EXPECT_EQ(post_ok("/infill", request), Json::object());
  // Without response_fields the whole answer: nothing generated for the client.
  Json full = request;
  full.erase("response_fields");
  full["model"] = "cpp";
  const Json r = post_ok("/infill", full);
  EXPECT_EQ(r["content"], "");
  EXPECT_EQ(r["stop_type"], "limit");
  EXPECT_EQ(r["tokens_predicted"], 0);
  EXPECT_EQ(r["model"], "cpp");
}

// llama.vscode's createRequestPayload(false, ...) (src/llama-server.ts at 3938fb3, 2026-08-19) with its defaults:
// n_predict 128, max_parallel_completions 3 as n_cmpl, defaultRequestParams {top_k 40, top_p 0.99, stream false,
// samplers [top_k, top_p, infill], cache_prompt true}, n_indent when non-zero, t_max_prompt_ms 500, t_max_predict_ms
// 500; chunks {text, time: Date.now(), filename}; no model (empty in its settings). It reads `content` (one answer
// or a list of them).
TEST_F(Infill, LlamaVscodeRequestAsSent) {
  const Json request = Json::parse(R"({
    "id_slot": 0,
    "input_prefix": "#include <vector>\n\nint sum(const std::vector<int>& v) {\n",
    "input_suffix": "\n  return total;\n}\n",
    "input_extra": [{"text": "int product(int a, int b) {\n  return a * b;\n}\n", "time": 1735689600123,
                     "filename": "/home/u/src/math.cpp"}],
    "prompt": "  int total = ",
    "n_predict": 128,
    "n_cmpl": 3,
    "top_k": 40,
    "top_p": 0.99,
    "stream": false,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": true,
    "n_indent": 2,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 500
  })");
  const Json r = post_ok("/infill", request);
  ASSERT_TRUE(r.contains("content"));
  EXPECT_TRUE(r["content"].is_string());
  for (const char* k : {"tokens_cached", "tokens_evaluated", "tokens_predicted"})
    EXPECT_TRUE(r[k].is_number_integer()) << k;
  for (const char* k :
       {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"})
    EXPECT_TRUE(r["timings"][k].is_number()) << k;
  EXPECT_TRUE(r["stop_type"] == "eos" || r["stop_type"] == "limit") << r["stop_type"];
  EXPECT_EQ(r["stopping_word"], "");
  EXPECT_EQ(r["truncated"], false);
  EXPECT_EQ(r["model"], "cpp");
  EXPECT_EQ(r["generation_settings"]["n_ctx"], 256);
  EXPECT_EQ(r["generation_settings"]["top_p"], 0.99);
}

// n_indent (llama.cpp's README: "minimum line indentation for the generated text in number of whitespace
// characters"; its server cuts the text at the first non-blank character of a line indented less, after a newline).
// The scripted text's third line "}" has no indentation: the answer ends before it, stop_type "limit".
TEST_F(Infill, NIndentCutsTheFirstLessIndentedLine) {
  script(spell("if (a) {\n    b();\n}\nint c;\n"));
  Json request = {{"input_prefix", "void f() {\n"},
                  {"input_suffix", ""},
                  {"prompt", "    "},
                  {"n_indent", 4},
                  {"n_predict", 64},
                  {"model", "scripted"}};
  Json r = post_ok("/infill", request);
  EXPECT_EQ(r["content"], "if (a) {\n    b();\n");
  EXPECT_EQ(r["stop_type"], "limit");
  // Blank indentation before the cut stays, as llama.cpp erases from the first other character.
  script(spell("x\n  \ty\n"));
  request["n_indent"] = 4;
  r = post_ok("/infill", request);
  EXPECT_EQ(r["content"], "x\n  \t");
  // Deep enough everywhere: nothing cut, the script runs out (n_predict is larger): stop_type "limit" from the length.
  script(spell("a\n    b\n"));
  request["n_indent"] = 4;
  request["n_predict"] = static_cast<int64_t>(test::code512().encode("a\n    b\n").size());
  r = post_ok("/infill", request);
  EXPECT_EQ(r["content"], "a\n    b\n");
  // Off (0): the same text as the script.
  script(spell("if (a) {\n    b();\n}\n"));
  request["n_indent"] = 0;
  request["n_predict"] = 64;
  r = post_ok("/infill", request);
  EXPECT_EQ(r["content"], "if (a) {\n    b();\n}\n");
}

// t_max_predict_ms (llama.cpp's README: "time limit in milliseconds for the prediction phase ... triggered if
// generation takes longer than this time and a new-line was generated"; its server checks it on each token that
// brings a newline). The script writes "one\n" at once, waits past the limit, writes "two", then "\n" and "three":
// the first newline comes in time, so generation goes on; the second comes late and ends it after itself.
TEST_F(Infill, TMaxPredictMsStopsAtTheFirstNewlineAfterTheTime) {
  const auto nl = test::code512().encode("\n");
  ASSERT_EQ(nl.size(), 1u);
  std::vector<ScriptedEngine::Step> steps = spell("one\n");
  for (auto& s : spell("two")) steps.push_back({s.token, std::chrono::milliseconds(800)});
  steps.push_back({nl[0], std::chrono::milliseconds(800)});
  for (auto& s : spell("three\n")) steps.push_back({s.token, std::chrono::milliseconds(800)});
  script(steps);
  Json request = {
      {"input_prefix", ""}, {"input_suffix", ""}, {"t_max_predict_ms", 400}, {"n_predict", 64}, {"model", "scripted"}};
  Json r = post_ok("/infill", request);
  EXPECT_EQ(r["content"], "one\ntwo\n");
  EXPECT_EQ(r["stop_type"], "limit");
  // Without the limit the whole script.
  script(steps);
  request.erase("t_max_predict_ms");
  r = post_ok("/infill", request);
  EXPECT_EQ(r["content"], "one\ntwo\nthree\n");
}

// stop strings: cut before the word, stop_type "word", stopping_word named.
TEST_F(Infill, StopWord) {
  script(spell("a = 1;\n// end\nb = 2;\n"));
  const Json r = post_ok(
      "/infill",
      {{"input_prefix", ""}, {"input_suffix", ""}, {"stop", {"// end"}}, {"n_predict", 64}, {"model", "scripted"}});
  EXPECT_EQ(r["content"], "a = 1;\n");
  EXPECT_EQ(r["stop_type"], "word");
  EXPECT_EQ(r["stopping_word"], "// end");
}

// The prompt the engine gets: SPM order with the extra chunk under its path, cache points at the end of the extra
// context and at the start of the cursor's line (ids from tokenizer/README.md: <|bos|> 2, <|fim_prefix|> 10,
// <|fim_suffix|> 11, <|fim_middle|> 12, <|file_sep|> 18).
TEST_F(Infill, PromptAndCachePoints) {
  auto& e = script(spell("x"));
  post_ok("/infill", {{"input_prefix", "a\nb\n"},
                      {"input_suffix", "s"},
                      {"prompt", "cd"},
                      {"input_extra", {{{"filename", "f.cpp"}, {"text", "t"}}}},
                      {"n_predict", 1},
                      {"model", "scripted"},
                      {"filename", "g.cpp"}});
  const auto& tok = test::code512();
  auto ids = [&](const std::string& s) {
    const auto v = tok.encode(s);
    return std::vector<int64_t>(v.begin(), v.end());
  };
  std::vector<int64_t> want = {2, 18};
  for (auto x : ids("f.cpp\nt")) want.push_back(x);
  want.push_back(18);
  for (auto x : ids("g.cpp\n")) want.push_back(x);
  const int64_t context_end = static_cast<int64_t>(want.size());
  want.push_back(10);
  want.push_back(11);
  for (auto x : ids("s")) want.push_back(x);
  want.push_back(12);
  const auto head = ids("a\nb\n");
  const int64_t line_start = static_cast<int64_t>(want.size() + head.size());
  for (auto x : ids("a\nb\ncd")) want.push_back(x);
  const engine::Request got = e.last();
  EXPECT_EQ(got.prompt, want);
  ASSERT_TRUE(std::equal(head.begin(), head.end(), want.begin() + context_end + 4));  // the tokenizer splits there
  EXPECT_EQ(got.cache_points, (std::vector<int64_t>{context_end, line_start}));
  // cache_prompt false: no points.
  post_ok("/infill", {{"input_prefix", "a\nb\n"},
                      {"input_suffix", "s"},
                      {"prompt", "cd"},
                      {"n_predict", 1},
                      {"model", "scripted"},
                      {"cache_prompt", false}});
  EXPECT_TRUE(e.last().cache_points.empty());
}

// An editor's request longer than the context is trimmed by the budget, never refused: 6,000 characters of C++
// before the cursor against a context of 256 tokens.
TEST_F(Infill, OverLongPrefixIsTrimmedNotRefused) {
  std::string prefix;
  for (int i = 0; prefix.size() < 6000; ++i)
    prefix += "int value_" + std::to_string(i) + " = compute(" + std::to_string(i) + ", state);\n";
  ASSERT_GE(prefix.size(), 6000u);
  const Json r = post_ok("/infill", {{"input_prefix", prefix},
                                     {"input_suffix", "}\n"},
                                     {"prompt", "  return "},
                                     {"filename", "big.cpp"},
                                     {"n_predict", 8},
                                     {"temperature", 0},
                                     {"samplers", {"temperature"}}});
  EXPECT_EQ(r["truncated"], true);
  EXPECT_LE(r["tokens_evaluated"].get<int64_t>(), 256 - 8);
  EXPECT_EQ(r["model"], "cpp");
}

// A user types a line, one character per request, as llama.vim sends them (greedy here, so that answers compare).
// After the first, every request restores at least 90% of its prompt from the cache, and each answer equals the
// same request's on the same weights with no cache at all.
TEST_F(Infill, TypingALineHitsTheCache) {
  std::string prefix = "#include <vector>\n\n// Sums the values of v.\nint sum(const std::vector<int>& v) {\n";
  prefix += "  if (v.empty()) return 0;\n  int count = 0;\n  for (int x : v) ++count;\n";
  const std::string line = "  int total = 0;";
  double min_share = 1;
  int64_t last_prompt = 0;
  for (size_t n = 1; n <= line.size(); ++n) {
    Json request = {{"input_prefix", prefix}, {"input_suffix", kSuffix}, {"prompt", line.substr(0, n)},
                    {"n_predict", 4},         {"temperature", 0},        {"samplers", {"temperature"}},
                    {"cache_prompt", true},   {"model", "cpp"}};
    const auto t0 = std::chrono::steady_clock::now();
    const Json cached = post_ok("/infill", request);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    request["model"] = "cpp-uncached";
    const Json fresh = post_ok("/infill", request);
    EXPECT_EQ(cached["content"], fresh["content"]) << "after " << n << " characters";
    EXPECT_EQ(fresh["tokens_cached"], 0);
    const int64_t prompt = cached["tokens_evaluated"].get<int64_t>();
    const int64_t hit = cached["tokens_cached"].get<int64_t>();
    EXPECT_EQ(cached["timings"]["prompt_n"].get<int64_t>() + hit, prompt);
    last_prompt = prompt;
    std::cout << "[typing] " << n << " chars: " << hit << "/" << prompt << " cached, " << ms << " ms\n";
    if (n == 1) continue;
    const double share = static_cast<double>(hit) / static_cast<double>(prompt);
    min_share = std::min(min_share, share);
    EXPECT_GE(share, 0.9) << "after " << n << " characters: " << hit << " of " << prompt << " tokens cached";
  }
  RecordProperty("min_cached_share", std::to_string(min_share));
  std::cout << "[typing] smallest cached share " << min_share << " (prompts of ~" << last_prompt << " tokens)\n";
}

// Which specialist answers: a named one wins; else the file's type from filename, from model as a file name, or from
// the text; else (several specialists, no router) none fits: 404 naming model.
TEST_F(Infill, WhichSpecialistAnswers) {
  auto who = [&](Json request) {
    request["input_suffix"] = "";
    request["n_predict"] = 1;
    std::string header;
    const Json r = post_ok("/infill", request, &header);
    EXPECT_EQ(r["model"], header);
    return header;
  };
  EXPECT_EQ(who({{"input_prefix", "#!/bin/bash\necho hi\n"}, {"model", "cpp"}}), "cpp");  // named
  EXPECT_EQ(who({{"input_prefix", "x = 1\n"}, {"filename", "tools/run.sh"}}), "shell");
  EXPECT_EQ(who({{"input_prefix", "x = 1\n"}, {"filename", "src/a.hpp"}}), "cpp");
  EXPECT_EQ(who({{"input_prefix", "x = 1\n"}, {"model", "deploy.bash"}}), "shell");
  EXPECT_EQ(who({{"input_prefix", "#!/usr/bin/env bash\nset -e\n"}}), "shell");
  EXPECT_EQ(who({{"input_prefix", "#include <map>\nstd::map<int, int> m;\n"}}), "cpp");
  auto r = post("/infill", R"({"input_prefix": "hello", "input_suffix": ""})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_EQ(Json::parse(r->body)["error"]["param"], "model");
}

// Streamed as llama.cpp streams: `data: {...}` events, pieces with stop false, then the final object with stop true
// and no [DONE].
TEST_F(Infill, StreamAsLlamaCpp) {
  script(spell("ab\ncd"));
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Post("/infill", R"({"input_prefix": "", "input_suffix": "", "stream": true, "n_predict": 64,
                                 "model": "scripted"})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(r->body.find("[DONE]"), std::string::npos);
  std::string text;
  const std::vector<Json> events = sse_events(r->body);
  ASSERT_GE(events.size(), 2u);
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["stop"], false);
    text += events[i]["content"].get<std::string>();
  }
  EXPECT_EQ(text, "ab\ncd");
  EXPECT_EQ(events.back()["stop"], true);
  EXPECT_EQ(events.back()["content"], "");
  EXPECT_EQ(events.back()["stop_type"], "limit");
}

// Malformed requests: each a 4xx with an error object naming the field.
TEST_F(Infill, MalformedRequests) {
  struct Case {
    std::string body;
    int status;
    std::string param;  // "" : none (the body itself)
  };
  const std::string ok = R"("input_prefix": "a", "input_suffix": "", "model": "scripted")";
  const std::vector<Case> cases = {
      {"not json", 400, ""},
      {"[]", 400, ""},
      {"{}", 400, "input_prefix"},
      {R"({"input_prefix": "a"})", 400, "input_suffix"},
      {R"({"input_prefix": 5, "input_suffix": ""})", 400, "input_prefix"},
      {R"({"input_prefix": "a", "input_suffix": ["b"]})", 400, "input_suffix"},
      {"{\"input_prefix\": \"\xff\xfe\", \"input_suffix\": \"\"}", 400, ""},  // invalid UTF-8
      {"{" + ok + ", \"prompt\": \"x\xc3\"}", 400, ""},
      {"{" + ok + ", \"stop\": [\"\xe2\x82\"]}", 400, ""},
      {"{" + ok + R"(, "prompt": 7})", 400, "prompt"},
      {"{" + ok + R"(, "stop": 5})", 400, "stop"},
      {"{" + ok + R"(, "stop": ["a", 1]})", 400, "stop"},
      {"{" + ok + R"(, "n_predict": 18446744073709551615})", 400, "n_predict"},
      {"{" + ok + R"(, "n_predict": 100000})", 400, "n_predict"},
      {"{" + ok + R"(, "n_predict": -2})", 400, "n_predict"},
      {"{" + ok + R"(, "n_predict": 1.5})", 400, "n_predict"},
      {"{" + ok + R"(, "n_predict": "8"})", 400, "n_predict"},
      {"{" + ok + R"(, "input_extra": "x"})", 400, "input_extra"},
      {"{" + ok + R"(, "input_extra": {"text": "x"}})", 400, "input_extra"},
      {"{" + ok + R"(, "input_extra": [{"filename": "a.cpp"}]})", 400, "input_extra[0]"},
      {"{" + ok + R"(, "input_extra": [{"text": "a"}, 5]})", 400, "input_extra[1]"},
      {"{" + ok + R"(, "input_extra": [{"text": 5}]})", 400, "input_extra[0]"},
      {"{" + ok + R"(, "input_extra": [{"text": "a", "filename": 3}]})", 400, "input_extra[0].filename"},
      {"{" + ok + R"(, "samplers": ["mirostat_v2"]})", 400, "samplers"},
      {"{" + ok + R"(, "samplers": ["min_p"]})", 400, "samplers"},
      {"{" + ok + R"(, "samplers": "kpt"})", 400, "samplers"},
      {"{" + ok + R"(, "n_probs": 5})", 400, "n_probs"},
      {"{" + ok + R"(, "grammar": "root ::= \"x\""})", 400, "grammar"},
      {"{" + ok + R"(, "json_schema": {"type": "object"}})", 400, "json_schema"},
      {"{" + ok + R"(, "mirostat": 2})", 400, "mirostat"},
      {"{" + ok + R"(, "n_cmpl": 9})", 400, "n_cmpl"},
      {"{" + ok + R"(, "temperature": "hot"})", 400, "temperature"},
      {"{" + ok + R"(, "temperature": 3})", 400, "temperature"},
      {"{" + ok + R"(, "top_p": 0})", 400, "top_p"},
      {"{" + ok + R"(, "top_k": 1.5})", 400, "top_k"},
      {"{" + ok + R"(, "seed": "x"})", 400, "seed"},
      {"{" + ok + R"(, "n_indent": -1})", 400, "n_indent"},
      {"{" + ok + R"(, "t_max_predict_ms": -5})", 400, "t_max_predict_ms"},
      {"{" + ok + R"(, "stream": "yes"})", 400, "stream"},
      {"{" + ok + R"(, "cache_prompt": 1})", 400, "cache_prompt"},
      {"{" + ok + R"(, "response_fields": 5})", 400, "response_fields"},
      {"{" + ok + R"(, "id_slot": "0"})", 400, "id_slot"},
      {R"({"input_prefix": "", "input_suffix": "", "model": "no-such-model"})", 404, "model"},
  };
  script(spell("x"));
  for (const auto& c : cases) {
    auto r = post("/infill", c.body);
    ASSERT_TRUE(r) << c.body;
    EXPECT_EQ(r->status, c.status) << c.body << " -> " << r->body;
    const Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error") && j["error"].contains("message")) << r->body;
    if (c.param.empty())
      EXPECT_TRUE(j["error"]["param"].is_null()) << c.body << " -> " << r->body;
    else
      EXPECT_EQ(j["error"]["param"], c.param) << c.body << " -> " << r->body;
  }
}

// llama.cpp's POST /completion as Continue's llama.cpp provider sends it (core/llm/llms/LlamaCpp.ts at 0c38ecf:
// {prompt, stream: true, ..._convertArgs}, every option set; JSON.stringify drops the unset ones, min_p and mirostat
// here) and reads it (streamSse, yielding each event's `content`): the text arrives in `data:` events, the engine gets
// the completion template's ids (<|bos|> 2, then the prompt's pieces) and the request's limits and sampling.
TEST_F(Infill, CompletionAsContinueSendsIt) {
  auto& e = script(spell("return a + b;\n}"));
  const Json request = Json::parse(R"({
    "prompt": "int add(int a, int b) {\n  ",
    "stream": true,
    "n_predict": 48,
    "frequency_penalty": 0.5,
    "presence_penalty": 0.25,
    "stop": ["\n}"],
    "top_k": 20,
    "top_p": 0.9,
    "temperature": 0.3,
    "model": "scripted"
  })");
  auto r = post("/completion", request.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::string text;
  const std::vector<Json> events = sse_events(r->body);
  for (const auto& ev : events)
    if (ev["stop"] == false) text += ev["content"].get<std::string>();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(text, "return a + b;");  // cut before the stop string, as llama.cpp's stop words do
  EXPECT_EQ(events.back()["stop"], true);
  EXPECT_EQ(events.back()["stop_type"], "word");
  EXPECT_EQ(events.back()["stopping_word"], "\n}");
  const engine::Request sent = e.last();
  std::vector<int64_t> expected = {2};
  for (uint32_t id : test::code512().encode("int add(int a, int b) {\n  ")) expected.push_back(id);
  EXPECT_EQ(sent.prompt, expected);
  EXPECT_EQ(sent.max_tokens, 48);
  EXPECT_EQ(sent.sampling.top_k, 20);
  EXPECT_DOUBLE_EQ(sent.sampling.top_p, 0.9);
  EXPECT_DOUBLE_EQ(sent.sampling.temperature, 0.3);
  EXPECT_DOUBLE_EQ(sent.sampling.frequency_penalty, 0.5);
  EXPECT_DOUBLE_EQ(sent.sampling.presence_penalty, 0.25);
  EXPECT_EQ(events.back()["tokens_evaluated"], static_cast<int64_t>(expected.size()));
}

// The three forms of a prompt give the same ids, so the same greedy answer on the hybrid: a string (<|bos|> first), a
// list of token ids (taken as they are), and a list mixing both (<|bos|> before a leading string); /completions is
// the same endpoint.
TEST_F(Infill, CompletionPromptForms) {
  const std::string prompt = "for (int i = 0; i < n; ++i) {";
  Json ids = Json::array({2});
  for (uint32_t id : test::code512().encode(prompt)) ids.push_back(id);
  Json mixed = Json::array({"for (int i = 0; "});
  for (uint32_t id : test::code512().encode("i < n; ++i) {")) mixed.push_back(id);
  const Json base = {{"n_predict", 6}, {"temperature", 0.0}, {"model", "cpp-uncached"}};
  auto ask = [&](const std::string& path, const Json& p) {
    Json body = base;
    body["prompt"] = p;
    return post_ok(path, body);
  };
  const Json a = ask("/completion", prompt);
  EXPECT_EQ(a["tokens_evaluated"], static_cast<int64_t>(ids.size()));
  EXPECT_EQ(a["tokens_predicted"], 6);
  EXPECT_EQ(a["model"], "cpp-uncached");
  EXPECT_EQ(a["stop_type"], "limit");
  EXPECT_NE(a["prompt"].get<std::string>().find(prompt), std::string::npos);
  EXPECT_EQ(ask("/completion", ids)["content"], a["content"]);
  // The mixed list's pieces tokenize on their own, so its ids may differ from the whole string's: the answer is
  // compared with the same ids sent as a list.
  Json mixed_ids = Json::array({2});
  for (uint32_t id : test::code512().encode("for (int i = 0; ")) mixed_ids.push_back(id);
  for (size_t i = 1; i < mixed.size(); ++i) mixed_ids.push_back(mixed[i]);
  const Json m = ask("/completions", mixed);
  EXPECT_EQ(m["tokens_evaluated"], static_cast<int64_t>(mixed_ids.size()));
  EXPECT_EQ(ask("/completion", mixed_ids)["content"], m["content"]);
}

TEST_F(Infill, CompletionMalformedRequests) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model": "scripted"})", "prompt"},
      {R"({"prompt": 5, "model": "scripted"})", "prompt"},
      {R"({"prompt": {"text": "a"}, "model": "scripted"})", "prompt"},
      {R"({"prompt": ["a", "b"], "model": "scripted"})", "prompt"},  // two prompts: llama.cpp answers a list
      {R"({"prompt": [2, 1.5], "model": "scripted"})", "prompt[1]"},
      {R"({"prompt": [2, 600], "model": "scripted"})", "prompt[1]"},  // past code512's 512 ids
      {R"({"prompt": [], "model": "scripted"})", "prompt"},
      {R"({"prompt": "a", "n_predict": 512, "model": "scripted"})", "prompt"},  // no room left in 512
      {R"({"prompt": "a", "n_probs": 3, "model": "scripted"})", "n_probs"},
      {R"({"prompt": "a", "temperature": 9, "model": "scripted"})", "temperature"},
  };
  script(spell("x"));
  for (const auto& [body, param] : cases) {
    auto r = post("/completion", body);
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, 400) << body << " -> " << r->body;
    const Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["param"], param) << body << " -> " << r->body;
  }
}

// The README's curl line ("Use it from your editor"), between its markers, run as it stands against this server.
TEST_F(Infill, ReadmeCurlLine) {
  std::ifstream readme(test::source_path("README.md"));
  std::stringstream all;
  all << readme.rdbuf();
  const std::string text = all.str();
  const std::string begin = "<!-- infill-curl -->\n```sh\n", end = "```\n<!-- /infill-curl -->";
  const size_t a = text.find(begin), b = text.find(end);
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  std::string cmd = text.substr(a + begin.size(), b - a - begin.size());
  while (!cmd.empty() && cmd.back() == '\n') cmd.pop_back();
  const std::string where = "http://127.0.0.1:8012/";
  const size_t at = cmd.find(where);
  ASSERT_NE(at, std::string::npos) << cmd;
  cmd.replace(at, where.size(), "http://127.0.0.1:" + std::to_string(port_) + "/");
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  const Json r = Json::parse(out, nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  EXPECT_TRUE(r["content"].is_string()) << out;
  EXPECT_EQ(r["model"], "cpp") << out;
}

// slm serve --workspace: a planted repository (hand-written, so the chunks expected are known), indexed before the
// server starts. The cursor in level(), which calls clamp(): clamp's definition and the outline of the header level's
// file includes go into the prompt after the client's chunks, the response and the log name them, a client chunk that
// already holds clamp's text keeps it out, and the refusals name their field.
const std::string kClampDef = "int clamp(int v, int lo, int hi) {\n  return v < lo ? lo : v > hi ? hi : v;\n}\n";
const std::string kMainCpp = "#include \"lib/math.h\"\nint main() { return clamp(3, 0, 2); }\n";

std::string plant_math_workspace(const std::string& tag) {
  const std::string dir = test::fresh_dir(tag);
  test::write_file(dir + "/lib/math.h", "#pragma once\nint clamp(int v, int lo, int hi);\n");
  test::write_file(dir + "/lib/math.cpp", "#include \"lib/math.h\"\n" + kClampDef);
  test::write_file(dir + "/app/main.cpp", kMainCpp);
  return dir;
}

// slm serve over the suite's specialists with one planted workspace, indexed before it starts; its log lines kept.
struct WorkspaceServer {
  WorkspaceServer(Specialists& specialists, const std::string& tag) : dir(plant_math_workspace(tag)), ws(dir) {
    ws.refresh();
    ServerOptions so;
    so.port = 0;
    so.threads = 4;
    so.workspaces = {&ws};
    so.log = [this](const std::string& l) {
      std::lock_guard lock(mu);
      lines.push_back(l);
    };
    srv = std::make_unique<Server>(specialists, so);
    port = srv->start();
  }
  std::string last_line() {
    std::lock_guard lock(mu);
    return lines.empty() ? "" : lines.back();
  }
  std::string dir;
  workspace::Workspace ws;
  std::mutex mu;
  std::vector<std::string> lines;
  std::unique_ptr<Server> srv;  // declared last: stopped before what it reads goes
  int port = 0;
};

TEST_F(Infill, WorkspaceContextGraphGoesIntoThePrompt) {
  const std::string& clamp_def = kClampDef;
  WorkspaceServer w(*specialists_, "infill-workspace");
  ASSERT_EQ(w.ws.status().files, 3u);
  httplib::Client c("127.0.0.1", w.port);
  c.set_read_timeout(120);
  script(spell("x"));
  const Json request = {{"model", "scripted"},
                        {"filename", "app/main.cpp"},
                        {"input_prefix", "#include \"lib/math.h\"\nint level(int x) {\n  int y = clamp(x, 0, 9);\n"},
                        {"prompt", "  "},
                        {"input_suffix", "\n  return y;\n}\n"},
                        {"input_extra", {{{"filename", "notes.txt"}, {"text", "client chunk\n"}}}},
                        {"n_predict", 1}};
  auto r = c.Post("/infill", request.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json j = Json::parse(r->body);
  const Json& ctx = j["slm_context"];
  EXPECT_EQ(ctx["workspace"], w.ws.root());
  EXPECT_EQ(ctx["file"], "app/main.cpp");
  EXPECT_EQ(ctx["ready"], true);
  EXPECT_EQ(ctx["function"], "level");
  EXPECT_EQ(ctx["client_chunks"], 1);
  EXPECT_EQ(ctx["duplicates"], 0);
  ASSERT_EQ(ctx["chunks"].size(), 2u) << ctx.dump();
  EXPECT_EQ(ctx["chunks"][0]["kind"], "include");
  EXPECT_EQ(ctx["chunks"][0]["name"], "lib/math.h");
  EXPECT_EQ(ctx["chunks"][1],
            Json({{"kind", "callee"}, {"name", "clamp"}, {"filename", "lib/math.cpp"}, {"line", 2}, {"bytes", 77}}));
  // The prompt: the client's chunk, then ours, each after its path; the callee nearest the cursor's text.
  const std::string prompt = j["prompt"];
  const size_t client_at = prompt.find("notes.txt\nclient chunk\n"), def_at = prompt.find("lib/math.cpp\n" + clamp_def),
               cursor_at = prompt.find("int level(int x)");
  ASSERT_NE(client_at, std::string::npos) << prompt;
  ASSERT_NE(def_at, std::string::npos) << prompt;
  EXPECT_LT(client_at, def_at);
  EXPECT_NE(cursor_at, std::string::npos);
  EXPECT_NE(w.last_line().find(" context: app/main.cpp in level: 2 chunk(s) added (include lib/math.h, callee clamp)"),
            std::string::npos)
      << w.last_line();

  // The editor already sent clamp's file: our chunk is a repeat and stays out.
  Json again = request;
  again["input_extra"] = {{{"filename", "lib/math.cpp"}, {"text", "#include \"lib/math.h\"\n" + clamp_def}}};
  r = c.Post("/infill", again.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json k = Json::parse(r->body)["slm_context"];
  EXPECT_EQ(k["duplicates"], 1);
  ASSERT_EQ(k["chunks"].size(), 1u) << k.dump();
  EXPECT_EQ(k["chunks"][0]["kind"], "include");

  // The workspace named by its root, the file absolute under it: the same context. A file elsewhere gets none.
  Json named = request;
  named["workspace"] = w.dir;
  named["filename"] = w.ws.root() + "/app/main.cpp";
  r = c.Post("/infill", named.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Json::parse(r->body)["slm_context"]["chunks"].size(), 2u);
  // No filename, as llama.vim sends: the only workspace's graph, the buffer's path unknown.
  Json unnamed = request;
  unnamed.erase("filename");
  r = c.Post("/infill", unnamed.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json u = Json::parse(r->body)["slm_context"];
  EXPECT_EQ(u["file"], "");
  EXPECT_EQ(u["function"], "level");
  ASSERT_EQ(u["chunks"].size(), 2u) << u.dump();
  EXPECT_EQ(u["chunks"][1]["name"], "clamp");
  Json elsewhere = request;
  elsewhere["filename"] = "/tmp/elsewhere/main.cpp";
  r = c.Post("/infill", elsewhere.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(Json::parse(r->body).contains("slm_context"));

  // Refusals, each naming its field: an unknown workspace, a path out of it, and (on the suite's server, which reads
  // no workspace) any workspace at all.
  auto refused = [&](httplib::Client& client, Json body, const std::string& param, const std::string& says) {
    auto res = client.Post("/infill", body.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    const Json e = Json::parse(res->body)["error"];
    EXPECT_EQ(e["param"], param) << res->body;
    EXPECT_NE(e["message"].get<std::string>().find(says), std::string::npos) << res->body;
  };
  Json unknown = request;
  unknown["workspace"] = "/nonexistent/repo";
  refused(c, unknown, "workspace", "is not a workspace of this server");
  Json out = named;
  out["filename"] = "../secrets.cpp";
  refused(c, out, "filename", "outside the workspace");
  httplib::Client plain("127.0.0.1", port_);
  refused(plain, named, "workspace", "reads no workspace");

  // /metrics: the workspace's index, its three files.
  r = c.Get("/metrics");
  ASSERT_TRUE(r);
  const std::string label = "{workspace=\"" + w.ws.root() + "\"} ";
  EXPECT_NE(r->body.find("slm_workspace_ready" + label + "1\n"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("slm_workspace_files" + label + "3\n"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("slm_workspace_functions" + label + "2\n"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("slm_workspace_cmake_files" + label + "0\n"), std::string::npos) << r->body;
}

// A CMake file of the workspace gets the CMake index's context: the target its window names, from the file that
// defines it (workspace/cmake_index.h).
TEST_F(Infill, ACMakeFileOfTheWorkspaceGetsTheTargetsItNames) {
  WorkspaceServer w(*specialists_, "infill-cmake");
  test::write_file(w.dir + "/lib/CMakeLists.txt", "add_library(math math.cpp)\n");
  w.ws.refresh();
  ASSERT_EQ(w.ws.status().cmake_files, 1u);
  httplib::Client c("127.0.0.1", w.port);
  c.set_read_timeout(120);
  script(spell("x"));
  const Json request = {{"model", "scripted"},
                        {"filename", "app/CMakeLists.txt"},
                        {"input_prefix", "add_executable(app main.cpp)\n"},
                        {"prompt", "target_link_libraries(app PRIVATE math"},
                        {"input_suffix", ")\n"},
                        {"n_predict", 1}};
  auto r = c.Post("/infill", request.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Json ctx = Json::parse(r->body)["slm_context"];
  EXPECT_EQ(ctx["file"], "app/CMakeLists.txt");
  ASSERT_EQ(ctx["chunks"].size(), 1u) << ctx.dump();
  EXPECT_EQ(ctx["chunks"][0], Json({{"kind", "target"},
                                    {"name", "math"},
                                    {"filename", "lib/CMakeLists.txt"},
                                    {"line", 1},
                                    {"bytes", 27}}));  // "add_library(math math.cpp)\n"
  EXPECT_NE(
      w.last_line().find(" context: app/CMakeLists.txt (no function at the cursor): 1 chunk(s) added (target math)"),
      std::string::npos)
      << w.last_line();
}

// A chat message naming a file of the workspace (`@app/main.cpp`, or the request's `files`) gets the file, the
// definitions it calls elsewhere and its headers' outlines before the question; a path out of the workspace, or any
// file on a server without one, is a 400 naming the field.
TEST_F(Infill, ChatMessagesNamingWorkspaceFilesGetTheirGraph) {
  WorkspaceServer w(*specialists_, "chat-workspace");
  ASSERT_EQ(w.ws.status().files, 3u);
  httplib::Client c("127.0.0.1", w.port);
  c.set_read_timeout(120);
  ScriptedEngine& engine = script(spell("x"));
  const std::string question = "What does @app/main.cpp return?";
  Json request = {{"model", "scripted"}, {"messages", {{{"role", "user"}, {"content", question}}}}, {"max_tokens", 1}};
  auto r = c.Post("/v1/chat/completions", request.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto ids = engine.last().prompt;
  const std::string prompt = tokenizer()->decode(std::vector<uint32_t>(ids.begin(), ids.end()));
  const size_t file_at = prompt.find("app/main.cpp:\n```\n" + kMainCpp + "```\n"),
               def_at = prompt.find("lib/math.cpp:2:\n```\n" + kClampDef + "```\n"),
               header_at = prompt.find("lib/math.h:\n```\n#pragma once\n"), question_at = prompt.find(question);
  ASSERT_NE(file_at, std::string::npos) << prompt;
  ASSERT_NE(def_at, std::string::npos) << prompt;
  ASSERT_NE(header_at, std::string::npos) << prompt;
  ASSERT_NE(question_at, std::string::npos) << prompt;
  EXPECT_LT(file_at, def_at);
  EXPECT_LT(def_at, question_at);
  EXPECT_NE(w.last_line().find(" context: 3 of 3 chunk(s) (file app/main.cpp, callee clamp, include lib/math.h)"),
            std::string::npos)
      << w.last_line();
  // The same through `files`, with a question that names nothing; an @word that is no file stays text.
  request["messages"][0]["content"] = "Explain this to @everyone.";
  request["files"] = {"lib/math.cpp"};
  r = c.Post("/v1/chat/completions", request.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto ids2 = engine.last().prompt;
  const std::string prompt2 = tokenizer()->decode(std::vector<uint32_t>(ids2.begin(), ids2.end()));
  EXPECT_NE(prompt2.find("lib/math.cpp:\n```\n#include \"lib/math.h\"\n" + kClampDef), std::string::npos) << prompt2;
  EXPECT_EQ(prompt2.find("app/main.cpp"), std::string::npos) << prompt2;
  EXPECT_NE(prompt2.find("Explain this to @everyone."), std::string::npos) << prompt2;

  auto refused = [&](httplib::Client& client, const Json& body, const std::string& says) {
    auto res = client.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    const Json e = Json::parse(res->body)["error"];
    EXPECT_EQ(e["param"], "files[0]") << res->body;
    EXPECT_NE(e["message"].get<std::string>().find(says), std::string::npos) << res->body;
  };
  Json out = request;
  out["files"] = {"../outside.cpp"};
  refused(c, out, "outside the workspace");
  out["files"] = {"lib/missing.cpp"};
  refused(c, out, "no such file");
  httplib::Client plain("127.0.0.1", port_);
  refused(plain, request, "reads no workspace");
}

}  // namespace
}  // namespace slm::server
