// slm serve in-process on an ephemeral loopback port with two micro specialists and a toy router, driven over
// HTTP: answers against the model's own greedy loop, streaming, stop strings, multi-turn chats, every error of a
// request body with its exact status and error object (by hand and by 10,000 damaged requests), models, metrics,
// concurrency, disconnects and the API key. The HTTP framing (lengths, chunks, methods, slow clients) is in
// test_server_http.cpp; full queues, timeouts and thread limits, each on a server of its own, in
// test_server_limits.cpp.
#include <gtest/gtest.h>
#include <httplib.h>

#include <limits>
#include <random>
#include <set>
#include <thread>

#include "data/data_test_util.h"
#include "engine/engine_test_util.h"
#include "serving_test_util.h"
#include "slm/engine/generation.h"
#include "slm/server/http_server.h"
#include "test_server_util.h"

namespace slm::server {
namespace {

using Json = nlohmann::json;

std::unique_ptr<data::Tokenizer> tokenizer() {
  return std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model")));
}

class ServerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::single_threaded();
    alpha_ = test::serving_model(11);
    specialists_ = new Specialists();
    LoadOptions lo;
    specialists_->add("alpha", alpha_, tokenizer(), {"cmake"}, lo);
    specialists_->add("beta", test::serving_model(12), tokenizer(), {"shell"}, lo);
    specialists_->set_router(test::toy_router());
    ServerOptions so;
    so.port = 0;
    so.threads = 16;
    so.max_body_bytes = 64 * 1024;
    so.default_max_tokens = 16;
    so.log = log_.sink();
    server_ = new Server(*specialists_, so);
    port_ = server_->start();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete specialists_;
    alpha_.reset();
  }

  static httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120);
    c.set_tcp_nodelay(true);
    return c;
  }
  static httplib::Result post(const std::string& path, const Json& body) {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  static Json chat(const std::string& model, const std::string& text, int max_tokens, Json extra = Json::object()) {
    Json j = {{"model", model},
              {"messages", {{{"role", "user"}, {"content", text}}}},
              {"max_tokens", max_tokens},
              {"temperature", 0}};
    j.update(extra);
    return j;
  }
  // The text of a stream of server-sent events, checking its shape on the way.
  static std::string stream_text(const std::string& body, bool is_chat, std::string* finish = nullptr) {
    std::string text;
    size_t start = 0;
    bool saw_done = false;
    while (start < body.size()) {
      const size_t end = body.find("\n\n", start);
      EXPECT_NE(end, std::string::npos) << "unterminated event";
      if (end == std::string::npos) break;
      const std::string ev = body.substr(start, end - start);
      start = end + 2;
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      const std::string data = ev.substr(6);
      EXPECT_FALSE(saw_done) << "event after [DONE]";
      if (data == "[DONE]") {
        saw_done = true;
        continue;
      }
      const auto j = Json::parse(data);
      EXPECT_EQ(j["object"], is_chat ? "chat.completion.chunk" : "text_completion");
      if (j["choices"].empty()) continue;  // usage chunk
      const auto& c = j["choices"][0];
      if (!c["finish_reason"].is_null() && finish) *finish = c["finish_reason"];
      if (is_chat && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
      if (!is_chat) text += c["text"].get<std::string>();
    }
    EXPECT_TRUE(saw_done);
    return text;
  }
  static std::string metrics() { return client().Get("/metrics")->body; }
  // The value of one metric line, or -1.
  static double metric(const std::string& line_prefix) {
    std::string m = "\n";  // a sample line, not the # HELP line naming the metric
    m += metrics();        // (appended: "\n" + metrics() trips a false -Wstringop-overflow in GCC 12 at -O3)
    const size_t at = m.find("\n" + line_prefix + " ");
    return at == std::string::npos ? -1 : std::stod(m.substr(at + line_prefix.size() + 2));
  }

  static inline std::shared_ptr<model::HybridLM> alpha_;
  static inline Specialists* specialists_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
  static inline test::LogLines log_;
};

// A request body as text with one field's value spelled out (for numbers nlohmann would not print as given).
std::string with_raw_field(const Json& body, const std::string& key, const std::string& raw_value) {
  Json j = body;
  j[key] = "@@RAW@@";
  std::string text = j.dump();
  text.replace(text.find("\"@@RAW@@\""), 9, raw_value);
  return text;
}

void expect_error(const httplib::Result& res, int status, const std::string& code, const std::string& param,
                  const std::string& fragment = "") {
  ASSERT_TRUE(res);
  test::expect_error(res->status, res->body, status, code, param, fragment);
}

TEST_F(ServerTest, ChatCompletionEqualsTheModelsGreedyTokens) {
  const std::string prompt = "Write a CMake target for libfoo.";
  const auto expected = test::greedy_reference(*alpha_, test::user_prompt(prompt), 24, test::chat_banned(), {3, 9});
  auto res = post("/v1/chat/completions", chat("alpha", prompt, 24));
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("X-SLM-Specialist"), "alpha");
  const auto j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["specialist"], "alpha");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], test::text_of(expected));
  EXPECT_EQ(j["usage"]["completion_tokens"], expected.size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], test::user_prompt(prompt).size());
  EXPECT_EQ(j["choices"][0]["finish_reason"], expected.size() == 24 ? "length" : "stop");
}

TEST_F(ServerTest, CompletionEqualsTheModelsGreedyTokens) {
  const std::string prompt = "int main() {";
  std::vector<int64_t> ids = {2};
  for (uint32_t id : test::code512().encode(prompt)) ids.push_back(id);
  const auto expected = test::greedy_reference(*alpha_, ids, 20, test::chat_banned(), {3, 9});
  auto res = post("/v1/completions", {{"model", "alpha"}, {"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}});
  ASSERT_EQ(res->status, 200) << res->body;
  const auto j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], test::text_of(expected));
}

// The penalties reach the sampler: a greedy answer with them is the penalized greedy reference, not the plain one.
// A random model rarely repeats a token by itself, so the penalties here pull towards repeats (below 1, negative).
TEST_F(ServerTest, PenaltiesShapeTheAnswer) {
  const std::string prompt = "int main() {";
  std::vector<int64_t> ids = {2};
  for (uint32_t id : test::code512().encode(prompt)) ids.push_back(id);
  const auto plain = test::greedy_reference(*alpha_, ids, 20, test::chat_banned(), {3, 9});
  const auto expected = test::greedy_reference(*alpha_, ids, 20, test::chat_banned(), {3, 9}, {0.3f, -2.0f, -1.0f});
  ASSERT_NE(expected, plain);  // else this model's answer cannot show the penalties
  auto res = post("/v1/completions", {{"model", "alpha"},
                                      {"prompt", prompt},
                                      {"max_tokens", 20},
                                      {"temperature", 0},
                                      {"repetition_penalty", 0.3},
                                      {"presence_penalty", -2},
                                      {"frequency_penalty", -1}});
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(Json::parse(res->body)["choices"][0]["text"], test::text_of(expected));
}

TEST_F(ServerTest, StreamedChunksConcatenateToTheWholeAnswer) {
  for (bool is_chat : {true, false}) {
    const Json body = is_chat ? chat("beta", "for f in *.txt; do", 30, {{"seed", 7}, {"temperature", 0.8}})
                              : Json{{"model", "beta"}, {"prompt", "#!/bin/sh\n"}, {"max_tokens", 30}, {"seed", 7}};
    const std::string path = is_chat ? "/v1/chat/completions" : "/v1/completions";
    auto whole = post(path, body);
    ASSERT_EQ(whole->status, 200) << whole->body;
    const auto wj = Json::parse(whole->body);
    Json sb = body;
    sb["stream"] = true;
    sb["stream_options"] = {{"include_usage", true}};
    auto streamed = post(path, sb);
    ASSERT_EQ(streamed->status, 200) << streamed->body;
    EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
    EXPECT_EQ(streamed->get_header_value("X-SLM-Specialist"), "beta");
    std::string finish;
    EXPECT_EQ(stream_text(streamed->body, is_chat, &finish),
              (is_chat ? wj["choices"][0]["message"]["content"] : wj["choices"][0]["text"]).get<std::string>());
    EXPECT_EQ(finish, wj["choices"][0]["finish_reason"].get<std::string>());
    EXPECT_NE(streamed->body.find("\"usage\":{\"completion_tokens\":" + wj["usage"]["completion_tokens"].dump()),
              std::string::npos);
  }
}

TEST_F(ServerTest, StopSequencesCutTheAnswer) {
  const std::string prompt = "Explain RAII.";
  const std::string full =
      test::text_of(test::greedy_reference(*alpha_, test::user_prompt(prompt), 40, test::chat_banned(), {3, 9}));
  ASSERT_GT(full.size(), 12u);
  const std::string stop = full.substr(8, 3);
  const std::string expected = full.substr(0, full.find(stop));
  for (bool stream : {false, true}) {
    auto res =
        post("/v1/chat/completions", chat("alpha", prompt, 40, {{"stop", {stop, "@@never@@"}}, {"stream", stream}}));
    ASSERT_EQ(res->status, 200) << res->body;
    std::string finish;
    const std::string text = stream ? stream_text(res->body, true, &finish)
                                    : Json::parse(res->body)["choices"][0]["message"]["content"].get<std::string>();
    if (!stream) finish = Json::parse(res->body)["choices"][0]["finish_reason"];
    EXPECT_EQ(text, expected) << "stream " << stream;
    EXPECT_EQ(finish, "stop");
  }
}

TEST_F(ServerTest, BadRequestsGetOpenAIErrorsAndTheServerKeepsAnswering) {
  auto c = client();
  expect_error(c.Post("/v1/chat/completions", "{\"model\": \"alpha\", ", "application/json"), 400, "invalid_json", "",
               "not valid JSON");
  expect_error(c.Post("/v1/chat/completions", "[1, 2]", "application/json"), 400, "invalid_json", "", "JSON object");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"max_tokens", "ten"}})), 400, "invalid_value",
               "max_tokens", "integer");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"temperature", 9}})), 400, "invalid_value",
               "temperature", "[0, 2]");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"n", 2}})), 400, "invalid_value", "n", "n = 1");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"presence_penalty", 3}})), 400, "invalid_value",
               "presence_penalty", "[-2, 2]");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"repetition_penalty", 0}})), 400,
               "invalid_value", "repetition_penalty", "(0, 10]");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"top_k", 2.5}})), 400, "invalid_value", "top_k",
               "integer");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"stop", {1, 2}}})), 400, "invalid_value", "stop",
               "strings");
  expect_error(
      post("/v1/chat/completions", {{"model", "alpha"}, {"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400,
      "invalid_value", "messages[0].role", "unknown role");
  expect_error(post("/v1/chat/completions", {{"model", "alpha"}}), 400, "invalid_value", "messages", "messages");
  expect_error(post("/v1/chat/completions", {{"model", "alpha"}, {"messages", Json::array()}}), 400, "invalid_value",
               "messages", "non-empty");
  expect_error(post("/v1/completions", {{"model", "alpha"}, {"prompt", {1, 2, 3}}}), 400, "invalid_value", "prompt",
               "token-id");
  expect_error(post("/v1/chat/completions", chat("gamma", "hi", 4)), 404, "model_not_found", "model", "gamma");
  expect_error(post("/v1/completions", {{"model", "gamma"}, {"prompt", "x"}}), 404, "model_not_found", "model",
               "the model \"gamma\" does not exist");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 5000)), 400, "context_length_exceeded", "max_tokens",
               "context");
  expect_error(post("/v1/chat/completions", chat("alpha", std::string(30000, 'x') + " y", 4)), 400,
               "context_length_exceeded", "messages", "the model's context is 4096 tokens");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"logprobs", true}})), 400,
               "unsupported_parameter", "logprobs", "not supported");
  // A content part or response_format whose "type" is not a string is a bad field, not an internal error.
  expect_error(post("/v1/chat/completions", Json::parse(R"({"model": "alpha", "messages": [{"role": "user",
                                                 "content": [{"type": 5, "text": "x"}]}]})")),
               400, "invalid_value", "messages[0].content[0]", "parts are supported");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"response_format", {{"type", 1}}}})), 400,
               "unsupported_parameter", "response_format", "not supported");
  expect_error(c.Post("/v1/chat/completions", std::string(70 * 1024, ' '), "application/json"), 413, "body_too_large",
               "", "larger than");
  expect_error(c.Get("/v2/nothing"), 404, "", "", "no such endpoint");
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Json::parse(health->body)["status"], "ok");
}

TEST_F(ServerTest, ModelsListEverySpecialistAndAuto) {
  auto res = client().Get("/v1/models");
  ASSERT_EQ(res->status, 200);
  const auto j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "list");
  std::vector<std::string> ids;
  for (const auto& m : j["data"]) ids.push_back(m["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"alpha", "beta", "auto", "auto-2"}));
  EXPECT_EQ(j["data"][0]["context_length"], 4096);
}

TEST_F(ServerTest, AutoRoutesByTheRouterAndSaysWhoAnswered) {
  for (const auto& [prompt, who] : std::vector<std::pair<std::string, std::string>>{
           {"find_package(fmt) add_library(x) target_link_libraries(x fmt)", "alpha"},
           {"cat log | grep error | awk '{print $2}' | xargs rm", "beta"}}) {
    auto res = post("/v1/chat/completions", chat("auto", prompt, 4));
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(res->get_header_value("X-SLM-Specialist"), who) << prompt;
    const auto j = Json::parse(res->body);
    EXPECT_EQ(j["specialist"], who);
    EXPECT_NEAR(j["routing"]["alpha"].get<double>() + j["routing"]["beta"].get<double>(), 1.0, 1e-9);
    EXPECT_GT(j["routing"][who].get<double>(), 0.5);
  }
}

// "auto-2": both specialists decode together, weighted by the router; the answer is engine::generate_mixture's with
// those weights (its own test checks the mixing against full forwards), in the router's order of names.
TEST_F(ServerTest, Auto2MixesTheTopTwoSpecialistsByTheRoutersWeights) {
  const std::string prompt = "find_package(fmt) add_library(x) target_link_libraries(x fmt)";
  auto res = post("/v1/chat/completions", chat("auto-2", prompt, 12));
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("X-SLM-Specialist"), "alpha+beta");
  const auto j = Json::parse(res->body);
  EXPECT_EQ(j["specialist"], "alpha+beta");
  const double wa = j["routing"]["alpha"], wb = j["routing"]["beta"];
  EXPECT_GT(wa, wb);
  engine::GenerationOptions o;
  o.max_tokens = 12;
  o.sampling.temperature = 0;
  o.banned = torch::zeros({512}, torch::kBool);
  for (int64_t b : test::chat_banned()) o.banned[b] = true;
  std::vector<int64_t> expected;
  engine::generate_mixture({{alpha_.get(), wa}, {specialists_->find("beta")->model.model.get(), wb}},
                           test::user_prompt(prompt), o, [&](int64_t id) {
                             if (id == 3 || id == 9) return false;
                             expected.push_back(id);
                             return true;
                           });
  EXPECT_EQ(j["choices"][0]["message"]["content"], test::text_of(expected));
  EXPECT_EQ(j["usage"]["completion_tokens"], expected.size());
  EXPECT_GT(metric("slm_generations_total{specialist=\"alpha+beta\"}"), 0);
}

TEST_F(ServerTest, MetricsCountRequestsAndTokens) {
  const std::string ok = "slm_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}";
  const std::string tokens = "slm_completion_tokens_total{specialist=\"beta\"}";
  const double before = std::max(0.0, metric(ok)), tokens_before = std::max(0.0, metric(tokens));
  // Tensors that earlier tests of this process left on a GPU are counted too (the GPU machine runs the whole suite):
  // what must hold is that serving these CPU models allocates none.
  const double cuda_before = metric("slm_cuda_allocated_bytes");
  int64_t generated = 0;
  for (int i = 0; i < 3; ++i) {
    auto res = post("/v1/completions", {{"model", "beta"}, {"prompt", "echo " + std::to_string(i)}, {"max_tokens", 5}});
    ASSERT_EQ(res->status, 200);
    generated += Json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
  }
  EXPECT_EQ(metric(ok), before + 3);
  EXPECT_EQ(metric(tokens), tokens_before + generated);
  const std::string m = metrics();
  EXPECT_NE(m.find("# TYPE slm_request_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(m.find("slm_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
  EXPECT_NE(m.find("slm_queue_depth{specialist=\"alpha\"} 0"), std::string::npos);
  EXPECT_NE(m.find("# TYPE slm_prompts_batched_total counter"), std::string::npos);
  EXPECT_EQ(metric("slm_prompts_batched_total{specialist=\"beta\"}"), 0.0);  // one request at a time: none shared
  int64_t alpha_bytes = 0;                                                   // FP32 parameters and buffers
  for (const auto& p : alpha_->parameters()) alpha_bytes += p.numel() * 4;
  for (const auto& b : alpha_->buffers()) alpha_bytes += b.numel() * static_cast<int64_t>(b.element_size());
  EXPECT_EQ(metric("slm_specialist_weight_bytes{specialist=\"alpha\"}"), static_cast<double>(alpha_bytes));
  EXPECT_GT(metric("slm_process_resident_bytes"), static_cast<double>(alpha_bytes));
  EXPECT_EQ(metric("slm_cuda_allocated_bytes"), cuda_before);  // nothing here runs on a GPU
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(cuda_before, 0.0);
  }
}

TEST_F(ServerTest, ConcurrentClientsAllComplete) {
  constexpr int kThreads = 8, kEach = 3;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        Json body = chat(t % 2 ? "alpha" : "auto", "request " + std::to_string(t * 10 + i), 8);
        const bool stream = (t + i) % 2 == 0;
        body["stream"] = stream;
        auto res = post("/v1/chat/completions", body);
        if (res && res->status == 200 &&
            (stream ? res->body.find("data: [DONE]") != std::string::npos
                    : Json::parse(res->body)["usage"]["completion_tokens"] > 0))
          ++ok;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, kThreads * kEach);
}

// The engine is held while the client hangs up, so the generation cannot end by itself first: it must end cancelled
// once the engine lets go, with no token generated.
TEST_F(ServerTest, ADisconnectedClientCancelsItsGeneration) {
  const std::string cancelled = "slm_cancelled_total{specialist=\"beta\"}";
  const std::string tokens = "slm_completion_tokens_total{specialist=\"beta\"}";
  auto& beta = *specialists_->find("beta");
  for (bool stream : {true, false}) {
    const double before = std::max(0.0, metric(cancelled)), tokens_before = std::max(0.0, metric(tokens));
    const size_t gone_before = log_.count("499 client went away");
    {
      auto hold = test::hold_engine(beta);
      test::RawClient raw(port_);
      const Json body = chat("beta", "a long answer please", 4000, {{"stream", stream}});
      ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/chat/completions", body.dump())));
      ASSERT_TRUE(test::wait_until([&] { return beta.engine->stats().running == 1; })) << "stream " << stream;
      raw.close();
      ASSERT_TRUE(log_.wait_for("499 client went away", gone_before + 1)) << "stream " << stream;
    }
    ASSERT_TRUE(test::wait_until([&] { return metric(cancelled) == before + 1; })) << "stream " << stream;
    EXPECT_EQ(metric(tokens), tokens_before) << "stream " << stream;
    EXPECT_EQ(beta.engine->stats().running, 0);  // counted after the engine let go
  }
}

// auto-2 runs on the mixture's own engine; holding one member's model holds it too.
TEST_F(ServerTest, ADisconnectDuringAuto2CancelsTheMixture) {
  const std::string cancelled = "slm_cancelled_total{specialist=\"alpha+beta\"}";
  const std::string tokens = "slm_completion_tokens_total{specialist=\"alpha+beta\"}";
  engine::Engine& mixture = *specialists_->mixture(0, 1);
  for (bool stream : {true, false}) {
    const double before = std::max(0.0, metric(cancelled)), tokens_before = std::max(0.0, metric(tokens));
    const size_t gone_before = log_.count("499 client went away");
    {
      auto hold = test::hold_engine(*specialists_->find("alpha"));
      test::RawClient raw(port_);
      const Json body =
          chat("auto-2", "find_package(fmt) add_library(x) target_link_libraries(x fmt)", 4000, {{"stream", stream}});
      ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/chat/completions", body.dump())));
      ASSERT_TRUE(test::wait_until([&] { return mixture.stats().running == 1; })) << "stream " << stream;
      raw.close();
      ASSERT_TRUE(log_.wait_for("499 client went away", gone_before + 1)) << "stream " << stream;
    }
    ASSERT_TRUE(test::wait_until([&] { return metric(cancelled) == before + 1; })) << "stream " << stream;
    EXPECT_EQ(std::max(0.0, metric(tokens)), tokens_before) << "stream " << stream;
    EXPECT_EQ(mixture.stats().running, 0);
  }
}

// A conversation of several turns goes through the chat template as docs/serving.md writes it: each message
// <|role|> text <|end|> after <|bos|>, then <|assistant|>. The second request carries the first answer back.
TEST_F(ServerTest, MultiTurnChatsFollowTheTemplate) {
  auto encode = [](const std::string& text) {
    std::vector<int64_t> ids;
    for (uint32_t id : test::code512().encode(text)) ids.push_back(id);
    return ids;
  };
  Json messages = {{{"role", "system"}, {"content", "You answer in CMake."}},
                   {{"role", "user"}, {"content", "How do I add a library?"}},
                   {{"role", "assistant"}, {"content", "add_library(foo foo.cpp)"}},
                   {{"role", "user"}, {"content", "And link it?"}}};
  const std::map<std::string, int64_t> marker = {{"system", 4}, {"user", 5}, {"assistant", 6}};
  for (int turn = 0; turn < 2; ++turn) {
    std::vector<int64_t> ids = {2};
    for (const auto& m : messages) {
      ids.push_back(marker.at(m["role"].get<std::string>()));
      for (int64_t id : encode(m["content"].get<std::string>())) ids.push_back(id);
      ids.push_back(9);
    }
    ids.push_back(6);
    const std::string expected = test::text_of(test::greedy_reference(*alpha_, ids, 12, test::chat_banned(), {3, 9}));
    for (bool stream : {false, true}) {
      auto res = post("/v1/chat/completions",
                      {{"model", "alpha"}, {"messages", messages}, {"max_tokens", 12}, {"temperature", 0},
                       {"stream", stream}, {"stream_options", {{"include_usage", true}}}});
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200) << res->body;
      if (stream) {
        EXPECT_EQ(stream_text(res->body, true), expected) << "turn " << turn;
        EXPECT_NE(res->body.find("\"prompt_tokens\":" + std::to_string(ids.size())), std::string::npos);
      } else {
        const auto j = Json::parse(res->body);
        EXPECT_EQ(j["choices"][0]["message"]["content"], expected) << "turn " << turn;
        EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size()) << "turn " << turn;
      }
    }
    messages.push_back({{"role", "assistant"}, {"content", expected}});
    messages.push_back({{"role", "user"}, {"content", "Thanks. And install it?"}});
  }
}

// Every out-of-range max_tokens (and max_completion_tokens) reaches the server as written and is refused by name:
// OpenAI's max_tokens is an integer of at least 1, and one beyond the context is a context error, however large
// (INT64_MAX must not overflow the context check, nor 2^63 and more wrap negative). Below: 1 passes.
TEST_F(ServerTest, MaxTokensOutOfRangeIsRefusedByName) {
  struct Case {
    std::string raw, code, fragment;
  };
  const std::vector<Case> cases = {
      {"0", "invalid_value", "must be at least 1"},
      {"-1", "invalid_value", "must be at least 1"},
      {"-9223372036854775808", "invalid_value", "must be at least 1"},
      {"2.5", "invalid_value", "expected an integer"},
      {"1.0", "invalid_value", "expected an integer"},
      {"1e30", "invalid_value", "expected an integer"},
      {"\"4\"", "invalid_value", "expected an integer"},
      {"4096", "context_length_exceeded", "exceeds the model's context of 4096 tokens"},
      {"2147483647", "context_length_exceeded", "exceeds the model's context of 4096 tokens"},
      {"2147483648", "context_length_exceeded", "exceeds the model's context of 4096 tokens"},
      {"9223372036854775807", "context_length_exceeded", "exceeds the model's context of 4096 tokens"},
      {"9223372036854775808", "context_length_exceeded", "9223372036854775808 is more tokens than any model's context"},
      {"18446744073709551615", "context_length_exceeded", "18446744073709551615 is more tokens"},
  };
  for (const std::string key : {"max_tokens", "max_completion_tokens"})
    for (bool is_chat : {true, false}) {
      Json base = is_chat ? Json{{"model", "alpha"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}
                          : Json{{"model", "alpha"}, {"prompt", "hi"}};
      for (const auto& c : cases) {
        SCOPED_TRACE(key + " = " + c.raw + (is_chat ? " (chat)" : " (completion)"));
        // The context check names max_tokens whichever field gave it; the parser names the field.
        const std::string param = c.fragment.find("exceeds") != std::string::npos ? "max_tokens" : key;
        expect_error(client().Post(is_chat ? "/v1/chat/completions" : "/v1/completions",
                                   with_raw_field(base, key, c.raw), "application/json"),
                     400, c.code, param, c.fragment);
      }
      auto ok = client().Post(is_chat ? "/v1/chat/completions" : "/v1/completions", with_raw_field(base, key, "1"),
                              "application/json");
      ASSERT_TRUE(ok);
      ASSERT_EQ(ok->status, 200) << ok->body;
      EXPECT_LE(Json::parse(ok->body)["usage"]["completion_tokens"], 1);
    }
}

// JSON cannot carry invalid UTF-8, so wherever it stands the body is refused as malformed JSON.
TEST_F(ServerTest, InvalidUtf8AnywhereIsRefusedAsMalformedJson) {
  const std::string bad = "\xC3\x28", lone = "\x80", cut = "\xE2\x82";
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {"/v1/completions", "{\"model\":\"alpha\",\"prompt\":\"int " + bad + "\",\"max_tokens\":2}"},
      {"/v1/completions", "{\"model\":\"alpha\",\"prompt\":[\"" + lone + "\"],\"max_tokens\":2}"},
      {"/v1/completions", "{\"model\":\"alpha\",\"prompt\":\"x\",\"stop\":\"" + cut + "\",\"max_tokens\":2}"},
      {"/v1/chat/completions",
       "{\"model\":\"alpha\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[\"a\",\"" + bad + "\"]}"},
      {"/v1/chat/completions",
       "{\"model\":\"al" + lone + "pha\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}"},
      {"/v1/completions", "{\"model\":\"" + bad + "\",\"prompt\":\"x\"}"},
      {"/v1/chat/completions", "{\"model\":\"alpha\",\"messages\":[{\"role\":\"user\",\"content\":\"" + bad + "\"}]}"},
      {"/v1/chat/completions", "{\"model\":\"alpha\",\"messages\":[{\"role\":\"us" + cut + "\",\"content\":\"x\"}]}"},
  };
  auto c = client();
  for (const auto& [path, body] : bodies) {
    SCOPED_TRACE(path + " " + body);
    expect_error(c.Post(path.c_str(), body, "application/json"), 400, "invalid_json", "", "UTF-8");
  }
  // The same bodies with valid text are answered.
  auto ok = c.Post("/v1/completions", "{\"model\":\"alpha\",\"prompt\":\"int \xC3\xA9\",\"stop\":\"\xE2\x82\xAC\",\"max_tokens\":2}",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

}  // namespace
}  // namespace slm::server

namespace slm::server {
namespace {

// What the server must answer to a request body by the documented rules (docs/serving.md "HTTP API", the fields of
// server/openai.h, the chat template's ids, this fixture's models: alpha, beta, auto, auto-2, context 4096, default
// max_tokens 16), written out here apart from the server's parser. A body breaking several rules may be refused for
// any one of them: errors lists each (code, param) it may name ("" for a null param).
struct Expected {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> errors;
  bool stream = false;
  int64_t max_tokens = 0;
};

Expected expected_answer(const std::string& body, bool is_chat) {
  const Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return {400, {{"invalid_json", ""}}};
  std::vector<std::pair<std::string, std::string>> bad;
  auto invalid = [&](const std::string& param) { bad.emplace_back("invalid_value", param); };
  auto given = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  auto in_range = [&](const char* k, double lo, double hi, bool open_below) {
    if (!given(k)) return;
    if (!j[k].is_number()) return invalid(k);
    const double v = j[k].get<double>();
    if (!((open_below ? v > lo : v >= lo) && v <= hi)) invalid(k);
  };
  if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty()) invalid("model");
  std::vector<std::string> texts;  // what the prompt's ids encode: each message's content, or the prompt
  if (is_chat) {
    const Json messages = j.contains("messages") ? j["messages"] : Json();
    if (!messages.is_array() || messages.empty()) invalid("messages");
    const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; messages.is_array() && i < messages.size(); ++i) {
      const Json& m = messages[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        invalid(at);
        break;
      }
      if (!roles.count(m["role"].get<std::string>())) {
        invalid(at + ".role");
        break;
      }
      if (!m.contains("content")) {
        invalid(at + ".content");
        break;
      }
      const Json& content = m["content"];
      std::string text;
      bool ok = true;
      if (content.is_string()) {
        text = content.get<std::string>();
      } else if (content.is_array()) {
        for (size_t k = 0; ok && k < content.size(); ++k) {
          const Json& part = content[k];
          ok = part.is_object() && part.contains("type") && part["type"] == "text" && part.contains("text") &&
               part["text"].is_string();
          if (ok) text += part["text"].get<std::string>();
          if (!ok) invalid(at + ".content[" + std::to_string(k) + "]");
        }
      } else if (!content.is_null()) {
        ok = false;
        invalid(at + ".content");
      }
      if (!ok) break;
      texts.push_back(text);
    }
  } else {
    const Json prompt = j.contains("prompt") ? j["prompt"] : Json();
    if (prompt.is_string())
      texts.push_back(prompt.get<std::string>());
    else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string())
      texts.push_back(prompt[0].get<std::string>());
    else
      invalid("prompt");
  }
  std::optional<int64_t> max_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (!given(k)) continue;
    const Json& v = j[k];
    if (!v.is_number_integer())
      invalid(k);
    else if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
      bad.emplace_back("context_length_exceeded", k);
    else if (v.get<int64_t>() < 1)
      invalid(k);
    else
      max_tokens = v.get<int64_t>();
  }
  in_range("temperature", 0, 2, false);
  in_range("top_p", 0, 1, true);
  if (given("top_k") && (!j["top_k"].is_number_integer() ||
                         (!j["top_k"].is_number_unsigned() && j["top_k"].get<int64_t>() < -1)))
    invalid("top_k");
  in_range("presence_penalty", -2, 2, false);
  in_range("frequency_penalty", -2, 2, false);
  in_range("repetition_penalty", 0, 10, true);
  if (given("seed") && !j["seed"].is_number_integer()) invalid("seed");
  if (given("n") && !(j["n"].is_number_integer() && j["n"] == 1)) invalid("n");
  if (given("stop")) {
    const Json& s = j["stop"];
    if (!s.is_string() && !(s.is_array() && s.size() <= 4 &&
                            std::all_of(s.begin(), s.end(), [](const Json& x) { return x.is_string(); })))
      invalid("stop");
  }
  if (given("stream") && !j["stream"].is_boolean()) invalid("stream");
  if (given("stream_options")) {
    const Json& so = j["stream_options"];
    if (!so.is_object())
      invalid("stream_options");
    else if (so.contains("include_usage") && !so["include_usage"].is_boolean())
      invalid("stream_options.include_usage");
  }
  for (const char* k : {"logprobs", "echo"})
    if (given(k) && j[k] != false && j[k] != 0) bad.emplace_back("unsupported_parameter", k);
  for (const std::string k : {"tools", "functions", "best_of", "suffix", "top_logprobs", "response_format"})
    if (given(k.c_str()) && !(k == "best_of" && j[k] == 1) &&
        !(k == "response_format" && j[k].is_object() && j[k].contains("type") && j[k]["type"] == "text"))
      bad.emplace_back("unsupported_parameter", k);
  if (!bad.empty()) return {400, bad};

  const std::string model = j["model"];
  if (model != "alpha" && model != "beta" && model != "auto" && model != "auto-2")
    return {404, {{"model_not_found", "model"}}};
  int64_t n = 1;  // <|bos|>
  for (const auto& t : texts)
    n += static_cast<int64_t>(test::code512().encode(t).size()) + (is_chat ? 2 : 0);  // <|role|> text <|end|>
  if (is_chat) n += 1;                                                                 // <|assistant|>
  constexpr int64_t kContext = 4096;
  if (n >= kContext) return {400, {{"context_length_exceeded", is_chat ? "messages" : "prompt"}}};
  const int64_t m = max_tokens.value_or(std::min<int64_t>(16, kContext - n));
  if (m > kContext - n) return {400, {{"context_length_exceeded", "max_tokens"}}};  // n + m could overflow
  Expected e;
  e.stream = given("stream") && j["stream"] == true;
  e.max_tokens = m;
  return e;
}

// Random byte- and value-level damage to valid requests, each answered exactly as expected_answer says: the status,
// an OpenAI error object naming one of the rules the body breaks, or for a valid body a whole answer (plain or
// stream) of at most its max_tokens. The values include huge max_tokens, which reach the server as they are.
TEST_F(ServerTest, TenThousandMalformedRequestsGetTheirExactAnswers) {
  const std::vector<std::string> valid = {
      chat("alpha", "int x = 1;", 2).dump(),
      chat("auto", "make install", 2, {{"stop", {"\n"}}, {"stream", true}}).dump(),
      Json{{"model", "beta"}, {"prompt", "echo hi"}, {"max_tokens", 2}, {"top_p", 0.5}, {"seed", 1}}.dump()};
  const std::vector<Json> odd_values = {nullptr,
                                        -1,
                                        0,
                                        1,
                                        3,
                                        2.5,
                                        1e300,
                                        4096,
                                        std::numeric_limits<int32_t>::max(),
                                        uint64_t{1} << 31,
                                        std::numeric_limits<int64_t>::max(),
                                        uint64_t{1} << 63,
                                        std::numeric_limits<uint64_t>::max(),
                                        std::numeric_limits<int64_t>::min(),
                                        "x",
                                        "",
                                        "auto-2",
                                        Json::array(),
                                        Json::object(),
                                        true,
                                        false,
                                        Json::array({1, "a"}),
                                        Json::array({"\n", "x"}),
                                        std::string(300, '{'),
                                        Json::parse(R"([{"type": 5, "text": "x"}])"),
                                        Json::parse(R"([{"type": "text", "text": "ok"}, {"type": "text"}])"),
                                        Json::parse(R"([{"type": "text", "text": "ok"}])"),
                                        Json::parse(R"({"type": "text"})"),
                                        Json::parse(R"({"type": 1})"),
                                        Json::parse(R"({"include_usage": "yes"})")};
  const std::vector<std::string> paths = {"/model",
                                          "/messages",
                                          "/prompt",
                                          "/max_tokens",
                                          "/max_completion_tokens",
                                          "/temperature",
                                          "/top_p",
                                          "/top_k",
                                          "/presence_penalty",
                                          "/repetition_penalty",
                                          "/n",
                                          "/stop",
                                          "/stream",
                                          "/seed",
                                          "/stream_options",
                                          "/messages/0/role",
                                          "/messages/0/content",
                                          "/logprobs",
                                          "/best_of",
                                          "/response_format"};
  std::mt19937_64 rng(2024);
  auto c = client();
  c.set_keep_alive(true);
  std::map<int, int> by_status;
  std::map<std::string, int> by_code;
  for (int i = 0; i < 10000; ++i) {
    const bool chat_endpoint = i % 3 != 2;
    std::string body = valid[i % 3];
    if (i % 2 == 0) {  // byte-level: a few random edits
      for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n && !body.empty(); ++k) {
        const size_t at = rng() % body.size();
        switch (rng() % 4) {
          case 0: body.erase(at, 1 + rng() % 8); break;
          case 1: body.insert(at, 1, static_cast<char>(rng() % 256)); break;
          case 2: body[at] = static_cast<char>(rng() % 256); break;
          default: body.resize(at); break;
        }
      }
    } else {  // value-level: a field gets a value of the wrong type or out of range
      Json j = Json::parse(body);
      j[Json::json_pointer(paths[rng() % paths.size()])] = odd_values[rng() % odd_values.size()];
      body = j.dump();
    }
    const Expected e = expected_answer(body, chat_endpoint);
    auto res = c.Post(chat_endpoint ? "/v1/chat/completions" : "/v1/completions", body, "application/json");
    ASSERT_TRUE(res) << "no answer to request " << i << ": " << body;
    ++by_status[res->status];
    SCOPED_TRACE("request " + std::to_string(i) + ": " + body);
    if (e.status == 200) {
      ASSERT_EQ(res->status, 200) << res->body;
      if (e.stream) {
        EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
        ASSERT_GE(res->body.size(), 14u);
        EXPECT_EQ(res->body.substr(res->body.size() - 14), "data: [DONE]\n\n") << res->body;
      } else {
        const auto j = Json::parse(res->body);
        EXPECT_LE(j["usage"]["completion_tokens"].get<int64_t>(), e.max_tokens);
        const std::string finish = j["choices"][0]["finish_reason"];
        EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
      }
      continue;
    }
    ASSERT_EQ(res->status, e.status) << res->body;
    const auto j = Json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << res->body;
    const auto& err = j["error"];
    ASSERT_TRUE(err["message"].is_string()) << res->body;
    EXPECT_EQ(err["type"], test::error_type(e.status)) << res->body;
    const std::pair<std::string, std::string> named = {err["code"].is_string() ? err["code"].get<std::string>() : "",
                                                       err["param"].is_string() ? err["param"].get<std::string>() : ""};
    ASSERT_TRUE(err["param"].is_null() || err["param"].is_string()) << res->body;
    EXPECT_NE(std::find(e.errors.begin(), e.errors.end(), named), e.errors.end())
        << "named (" << named.first << ", " << named.second << "): " << res->body;
    ++by_code[named.first];
  }
  // The damage reached every kind of answer.
  std::string counts;
  for (const auto& [status, n] : by_status) counts += " " + std::to_string(status) + ": " + std::to_string(n);
  for (const auto& [code, n] : by_code) counts += ", " + code + ": " + std::to_string(n);
  RecordProperty("answers", counts);
  EXPECT_GT(by_status[200], 500) << counts;
  EXPECT_GT(by_code["invalid_json"], 1000) << counts;
  EXPECT_GT(by_code["invalid_value"], 1000) << counts;
  EXPECT_GT(by_code["context_length_exceeded"], 50) << counts;
  EXPECT_GT(by_code["unsupported_parameter"], 50) << counts;
  EXPECT_GT(by_code["model_not_found"], 20) << counts;
  auto ok = post("/v1/chat/completions", chat("alpha", "still there?", 3));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

}  // namespace
}  // namespace slm::server

namespace slm::server {
namespace {

TEST_F(ServerTest, ChatCliTalksToTheServerAndKeepsGoingAfterAnError) {
  const std::string expected = test::text_of(
      test::greedy_reference(*alpha_, test::user_prompt("Explain RAII."), 12, test::chat_banned(), {3, 9}));
  ASSERT_FALSE(expected.empty());
  const auto r = test::run_slm(
      "chat --url http://127.0.0.1:" + std::to_string(port_) + " --model nosuch --temperature 0 --max-tokens 12",
      std::string("hello\n/model alpha\nExplain RAII.\n/quit\n"));
  // Piped input: the failed first message is reported, the next is answered, and the exit status tells a script.
  ASSERT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the model \"nosuch\" does not exist"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chat: 1 of 2 messages got no answer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(expected + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(answered by alpha, finish "), std::string::npos) << r.out;
}

TEST(ServerChatCli, InProcessModelAnswers) {
  const auto r = test::run_slm(
      "chat --recipe " + test::source_path("recipes/tiny-hybrid.json") + " --random-weights --tokenizer " +
          test::source_path("tokenizer/slm-code-512.model") + " --temperature 0 --max-tokens 6",
      std::string("int main\n"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("RANDOM weights"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(answered by tiny-hybrid, finish "), std::string::npos) << r.out;
}

// In-process chat with --workspace: a message naming a file of it gets the file and the definition it calls, and
// stderr says so (the same context as /v1/chat/completions of slm serve --workspace).
TEST(ServerChatCli, InProcessWorkspaceFilesGoBeforeTheQuestion) {
  const std::string dir = test::fresh_dir("chat-ws");
  test::write_file(dir + "/lib/sq.cpp", "int sq(int v) { return v * v; }\n");
  test::write_file(dir + "/app/main.cpp", "int sq(int v);\nint main() { return sq(3); }\n");
  const std::string model = "chat --recipe " + test::source_path("recipes/tiny-hybrid.json") +
                            " --random-weights --tokenizer " + test::source_path("tokenizer/slm-code-512.model") +
                            " --temperature 0 --max-tokens 2 ";
  const auto r = test::run_slm(model + "--workspace " + dir + " --prompt 'What does @app/main.cpp return?'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(workspace context: 2 of 2 chunk(s) (file app/main.cpp, callee sq))"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(answered by tiny-hybrid, finish "), std::string::npos) << r.out;
  const auto plain = test::run_slm(model + "--workspace " + dir + " --prompt 'What does main return?'");
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("(workspace"), std::string::npos) << plain.out;
  const auto refused = test::run_slm("chat --url http://127.0.0.1:1 --workspace " + dir + " --prompt hi");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.out.find("--workspace is for in-process chat"), std::string::npos) << refused.out;
}

}  // namespace
}  // namespace slm::server
