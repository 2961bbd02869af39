// slm serve in-process on an ephemeral loopback port with two micro specialists and a toy router, driven over
// HTTP: answers against the model's own greedy loop, streaming, stop strings, errors, models, metrics,
// concurrency, disconnects and the API key.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "engine/engine_test_util.h"
#include "serving_test_util.h"
#include "slm/engine/generation.h"
#include "slm/server/http_server.h"

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
    const std::string m = "\n" + metrics();  // a sample line, not the # HELP line naming the metric
    const size_t at = m.find("\n" + line_prefix + " ");
    return at == std::string::npos ? -1 : std::stod(m.substr(at + line_prefix.size() + 2));
  }

  static inline std::shared_ptr<model::HybridLM> alpha_;
  static inline Specialists* specialists_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
};

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
  auto expect_error = [](const httplib::Result& res, int status, const std::string& fragment,
                         const std::string& param = "") {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const auto j = Json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << res->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(fragment), std::string::npos) << res->body;
    EXPECT_TRUE(j["error"]["type"].is_string());
    if (!param.empty()) EXPECT_EQ(j["error"]["param"], param);
  };
  auto c = client();
  expect_error(c.Post("/v1/chat/completions", "{\"model\": \"alpha\", ", "application/json"), 400, "not valid JSON");
  expect_error(c.Post("/v1/chat/completions", "[1, 2]", "application/json"), 400, "JSON object");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"max_tokens", "ten"}})), 400, "integer",
               "max_tokens");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"temperature", 9}})), 400, "[0, 2]",
               "temperature");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"n", 2}})), 400, "n = 1", "n");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"presence_penalty", 3}})), 400, "[-2, 2]",
               "presence_penalty");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"repetition_penalty", 0}})), 400, "(0, 10]",
               "repetition_penalty");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"top_k", 2.5}})), 400, "integer", "top_k");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"stop", {1, 2}}})), 400, "strings", "stop");
  expect_error(
      post("/v1/chat/completions", {{"model", "alpha"}, {"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400,
      "unknown role", "messages[0].role");
  expect_error(post("/v1/chat/completions", {{"model", "alpha"}}), 400, "messages", "messages");
  expect_error(post("/v1/completions", {{"model", "alpha"}, {"prompt", {1, 2, 3}}}), 400, "token-id", "prompt");
  expect_error(post("/v1/chat/completions", chat("gamma", "hi", 4)), 404, "gamma", "model");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 5000)), 400, "context", "max_tokens");
  expect_error(post("/v1/chat/completions", chat("alpha", std::string(30000, 'x') + " y", 4)), 400,
               "the model's context is 4096 tokens", "messages");
  expect_error(post("/v1/chat/completions", chat("alpha", "hi", 4, {{"logprobs", true}})), 400, "not supported");
  expect_error(
      c.Post("/v1/chat/completions",
             "{\"model\":\"alpha\",\"messages\":[{\"role\":\"user\",\"content\":\"\xC3\x28\"}]}", "application/json"),
      400, "UTF-8");
  expect_error(c.Post("/v1/chat/completions", std::string(70 * 1024, ' '), "application/json"), 413, "larger than");
  expect_error(c.Get("/v2/nothing"), 404, "no such endpoint");
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
  if (!torch::cuda::is_available()) EXPECT_EQ(cuda_before, 0.0);
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

// Sends a request on a raw socket, waits until the server has started answering (stream) or a moment (non-stream),
// and hangs up.
void request_and_hang_up(int port, const std::string& body, bool wait_for_bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  if (wait_for_bytes) {
    char buf[256];
    ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ::close(fd);
}

TEST_F(ServerTest, ADisconnectedClientCancelsItsGeneration) {
  const std::string cancelled = "slm_cancelled_total{specialist=\"beta\"}";
  const std::string tokens = "slm_completion_tokens_total{specialist=\"beta\"}";
  for (bool stream : {true, false}) {
    const double before = std::max(0.0, metric(cancelled)), tokens_before = std::max(0.0, metric(tokens));
    Json body = chat("beta", "a long answer please", 4000, {{"stream", stream}});
    request_and_hang_up(port_, body.dump(), stream);
    // The generation (4,000 tokens, seconds of work) must end early, counted as cancelled.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (metric(cancelled) < before + 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(metric(cancelled), before + 1) << "stream " << stream;
    EXPECT_LT(metric(tokens) - tokens_before, 4000) << "stream " << stream;
    EXPECT_EQ(specialists_->find("beta")->engine->stats().running, 0);  // counted after the engine let go
  }
}

TEST(ServerAuth, ApiKeyIsRequiredButNotForHealth) {
  test::single_threaded();
  Specialists sp;
  sp.add("solo", test::serving_model(21, 256), tokenizer(), {"solo"}, LoadOptions{});
  ServerOptions so;
  so.port = 0;
  so.api_key = "s3cret";
  Server srv(sp, so);
  httplib::Client c("127.0.0.1", srv.start());
  const std::string body = Json{{"model", "auto"}, {"prompt", "x"}, {"max_tokens", 2}}.dump();
  EXPECT_EQ(c.Post("/v1/completions", body, "application/json")->status, 401);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Post("/v1/completions", {{"Authorization", "Bearer s3cre"}}, body, "application/json")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto res = c.Post("/v1/completions", {{"Authorization", "Bearer s3cret"}}, body, "application/json");
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("X-SLM-Specialist"), "solo");  // one specialist: auto needs no router
  srv.stop();
}

}  // namespace
}  // namespace slm::server

namespace slm::server {
namespace {

// Random byte- and value-level damage to valid requests: every answer must be a 2xx or an OpenAI error object, and
// the server must still answer afterwards.
TEST_F(ServerTest, TenThousandMalformedRequestsGetErrorsAndNoCrash) {
  const std::vector<std::string> valid = {
      chat("alpha", "int x = 1;", 2).dump(),
      chat("auto", "make install", 2, {{"stop", {"\n"}}, {"stream", true}}).dump(),
      Json{{"model", "beta"}, {"prompt", "echo hi"}, {"max_tokens", 2}, {"top_p", 0.5}, {"seed", 1}}.dump()};
  const std::vector<Json> odd_values = {
      nullptr, -1, 0, 1e300, "x", Json::array(), Json::object(), true, Json::array({1, "a"}), std::string(300, '{')};
  std::mt19937_64 rng(2024);
  auto c = client();
  c.set_keep_alive(true);
  int answered = 0, errors_with_object = 0;
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
      const std::vector<std::string> keys = {"model", "messages", "prompt", "max_tokens", "temperature",   "top_p",
                                             "n",     "stop",     "stream", "seed",       "stream_options"};
      j[keys[rng() % keys.size()]] = odd_values[rng() % odd_values.size()];
      if (j.contains("max_tokens") && j["max_tokens"].is_number() && j["max_tokens"].get<double>() > 4)
        j["max_tokens"] = 2;  // keep the requests that stay valid cheap
      body = j.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    auto res = c.Post(chat_endpoint ? "/v1/chat/completions" : "/v1/completions", body, "application/json");
    ASSERT_TRUE(res) << "no answer to request " << i << ": " << body;
    ++answered;
    if (res->status == 200) continue;
    EXPECT_TRUE(res->status == 400 || res->status == 404) << res->status << " for " << body << ": " << res->body;
    const auto j = Json::parse(res->body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"]["message"].is_string())
      ++errors_with_object;
    else
      ADD_FAILURE() << "not an error object: " << res->body;
  }
  EXPECT_EQ(answered, 10000);
  EXPECT_GT(errors_with_object, 5000);
  auto ok = post("/v1/chat/completions", chat("alpha", "still there?", 3));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(ServerLimits, AFullQueueAnswers503AndATimeoutCutsTheAnswer) {
  test::single_threaded();
  Specialists sp;
  LoadOptions lo;
  lo.max_queue = 1;
  lo.slots = 1;  // one request generating, one waiting: the third finds the queue full
  // A model whose greedy answer never ends by itself: greedy decoding of a random model falls into a cycle within a
  // few hundred tokens, so one without <|eos|> 3 or <|end|> 9 in its first 300 tokens runs to max_tokens.
  std::shared_ptr<model::HybridLM> m;
  const std::vector<int64_t> prompt = {2, static_cast<int64_t>(test::code512().encode("x")[0])};
  for (uint64_t seed = 31; !m && seed < 60; ++seed) {
    auto candidate = test::serving_model(seed, 16384);
    if (test::greedy_reference(*candidate, prompt, 300, test::chat_banned(), {3, 9}).size() == 300) m = candidate;
  }
  ASSERT_TRUE(m) << "no seed gave a model that does not stop";
  sp.add("solo", m, tokenizer(), {"solo"}, lo);
  ServerOptions so;
  so.port = 0;
  so.request_timeout_s = 1;  // 16,000 tokens take several seconds
  Server srv(sp, so);
  const int port = srv.start();
  auto long_request = [port](int max_tokens) -> std::optional<httplib::Response> {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60);
    auto res = c.Post("/v1/completions",
                      Json{{"model", "solo"}, {"prompt", "x"}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump(),
                      "application/json");
    if (!res) return std::nullopt;
    return *res;
  };
  std::optional<httplib::Response> first, second;
  std::thread t1([&] { first = long_request(16000); });
  while (sp.all()[0]->engine->stats().running == 0) std::this_thread::yield();
  std::thread t2([&] { second = long_request(16000); });
  while (sp.all()[0]->engine->stats().queued == 0) std::this_thread::yield();
  auto third = long_request(4);
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 503) << third->body;
  EXPECT_EQ(third->get_header_value("Retry-After"), "1");
  EXPECT_EQ(Json::parse(third->body)["error"]["code"], "queue_full");
  t1.join();
  t2.join();
  for (auto* r : {&first, &second}) {
    ASSERT_TRUE(*r);
    ASSERT_EQ((*r)->status, 200) << (*r)->body;
    const auto j = Json::parse((*r)->body);
    // Cut by the 1 s timeout long before 16,000 tokens.
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), 16000);
  }
  srv.stop();
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

}  // namespace
}  // namespace slm::server
