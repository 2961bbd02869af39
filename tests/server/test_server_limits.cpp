// slm serve at its limits, each on a server of its own with one micro specialist: a full queue (503 with
// Retry-After), the request timeout on running and queued requests, a client that hangs up while queued, more clients
// than HTTP threads, the read timeout on stalled clients, and the API key. No test waits for a time to pass or races
// a generation: the engine is held (its model's in_use lock) and the server's cancellations are watched or held
// through an EngineProbe (test_server_util.h).
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "engine/engine_test_util.h"
#include "serving_test_util.h"
#include "slm/server/http_server.h"
#include "test_server_util.h"

namespace slm::server {
namespace {

using Json = nlohmann::json;

std::unique_ptr<data::Tokenizer> tokenizer() {
  return std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model")));
}

struct SoloServer {
  SoloServer(LoadOptions lo, ServerOptions so) {
    test::single_threaded();
    specialists.add("solo", test::serving_model(31, 512), tokenizer(), {"solo"}, lo);
    probe = &test::EngineProbe::install(solo());
    so.port = 0;
    so.log = log.sink();
    server = std::make_unique<Server>(specialists, so);
    port = server->start();
  }
  Specialist& solo() { return *specialists.all()[0]; }
  engine::Stats stats() { return solo().engine->stats(); }
  double metric(const std::string& line_prefix) {
    httplib::Client c("127.0.0.1", port);
    auto res = c.Get("/metrics");
    std::string m = "\n";  // a sample line, not the # HELP line
    if (res) m += res->body;
    const size_t at = m.find("\n" + line_prefix + " ");
    return at == std::string::npos ? -1 : std::stod(m.substr(at + line_prefix.size() + 2));
  }

  test::LogLines log;
  Specialists specialists;
  test::EngineProbe* probe = nullptr;
  std::unique_ptr<Server> server;  // last: stopped before what it serves goes
  int port = 0;
};

std::optional<httplib::Response> completion(int port, int max_tokens, bool stream) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  auto res = c.Post("/v1/completions",
                    Json{{"model", "solo"},
                         {"prompt", "x"},
                         {"max_tokens", max_tokens},
                         {"temperature", 0},
                         {"stream", stream},
                         {"stream_options", {{"include_usage", true}}}}
                        .dump(),
                    "application/json");
  if (!res) return std::nullopt;
  return *res;
}

// A request cut before its first token (by the timeout while the engine was held): 200, finish "length", no text,
// whether streamed or not.
void expect_cut_before_any_token(const std::optional<httplib::Response>& r, bool stream) {
  ASSERT_TRUE(r) << "no answer";
  ASSERT_EQ(r->status, 200) << r->body;
  if (!stream) {
    const auto j = Json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["choices"][0]["text"], "");
    EXPECT_EQ(j["usage"]["completion_tokens"], 0);
    return;
  }
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  // data: {final chunk}, data: {usage}, data: [DONE]
  std::vector<Json> events;
  for (size_t at = 0; (at = r->body.find("data: ", at)) != std::string::npos; at += 6) {
    const std::string data = r->body.substr(at + 6, r->body.find("\n\n", at) - at - 6);
    if (data != "[DONE]") events.push_back(Json::parse(data));
  }
  ASSERT_EQ(events.size(), 2u) << r->body;
  EXPECT_EQ(events[0]["choices"][0]["finish_reason"], "length") << r->body;
  EXPECT_EQ(events[0]["choices"][0]["text"], "") << r->body;
  EXPECT_EQ(events[1]["usage"]["completion_tokens"], 0) << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
}

TEST(ServerLimits, AFullQueueAnswers503WithRetryAfterToPlainAndStreamingRequests) {
  LoadOptions lo;
  lo.max_queue = 1;
  lo.slots = 1;  // one request running, one waiting: the next finds the queue full
  SoloServer s(lo, {});
  std::optional<httplib::Response> running, queued;
  std::vector<std::jthread> clients;  // before the hold: they finish after it is let go
  auto hold = test::hold_engine(s.solo());
  clients.emplace_back([&] { running = completion(s.port, 4, false); });
  ASSERT_TRUE(test::wait_until([&] { return s.stats().running == 1; }));
  clients.emplace_back([&] { queued = completion(s.port, 4, true); });
  ASSERT_TRUE(test::wait_until([&] { return s.stats().queued == 1; }));
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "plain");
    auto full = completion(s.port, 4, stream);
    ASSERT_TRUE(full);
    test::expect_error(full->status, full->body, 503, "queue_full", "", "specialist \"solo\" is busy");
    EXPECT_EQ(full->get_header_value("Retry-After"), "1");
    EXPECT_EQ(full->get_header_value("Content-Type"), "application/json");  // refused before any stream began
  }
  httplib::Client c("127.0.0.1", s.port);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(Json::parse(health->body)["specialists"][0], Json({{"name", "solo"}, {"queued", 1}, {"running", 1}}));
  hold.unlock();
  clients.clear();
  ASSERT_TRUE(running);
  EXPECT_EQ(running->status, 200) << running->body;
  ASSERT_TRUE(queued);
  EXPECT_EQ(queued->status, 200) << queued->body;
  EXPECT_NE(queued->body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(s.metric("slm_http_requests_total{endpoint=\"/v1/completions\",status=\"503\"}"), 2);
}

// Both requests run out of time (0.2 s) while the engine is held: the queued one is answered at once, still held,
// and the running one as soon as the engine takes its next step, neither with a token. Each round has one of them
// streamed. The cancellations wait in the probe until both are queued or running, so the timeout races nothing.
TEST(ServerLimits, TheTimeoutCutsRunningAndQueuedRequestsPlainAndStreamed) {
  LoadOptions lo;
  lo.max_queue = 4;
  lo.slots = 1;
  ServerOptions so;
  so.request_timeout_s = 0.2;
  SoloServer s(lo, so);
  size_t seen = 0;  // requests the engine has accepted
  for (bool running_streams : {false, true}) {
    SCOPED_TRACE(running_streams ? "running request streamed" : "queued request streamed");
    std::optional<httplib::Response> running, queued;
    std::vector<std::jthread> clients;
    auto hold = test::hold_engine(s.solo());
    auto cancels = s.probe->hold_cancels();
    clients.emplace_back([&] { running = completion(s.port, 100, running_streams); });
    const auto running_id = s.probe->submitted(seen++);
    ASSERT_TRUE(test::wait_until([&] { return s.stats().running == 1; }));
    clients.emplace_back([&] { queued = completion(s.port, 100, !running_streams); });
    const auto queued_id = s.probe->submitted(seen++);
    ASSERT_TRUE(test::wait_until([&] { return s.stats().queued == 1; }));
    ASSERT_TRUE(s.probe->wait_cancel_asked(running_id));
    ASSERT_TRUE(s.probe->wait_cancel_asked(queued_id));
    cancels.release();
    ASSERT_TRUE(s.probe->wait_cancelled(queued_id));
    clients[1].join();  // the engine is still held
    ASSERT_TRUE(s.probe->wait_cancelled(running_id));  // before the engine moves: else it would run until told
    expect_cut_before_any_token(queued, !running_streams);
    EXPECT_EQ(s.stats().queued, 0);
    hold.unlock();
    clients[0].join();
    expect_cut_before_any_token(running, running_streams);
  }
}

TEST(ServerLimits, AClientThatHangsUpWhileQueuedIsCancelledAtOnce) {
  LoadOptions lo;
  lo.max_queue = 4;
  lo.slots = 1;
  SoloServer s(lo, {});
  size_t seen = 0;
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "plain");
    std::optional<httplib::Response> running;
    std::vector<std::jthread> clients;
    auto hold = test::hold_engine(s.solo());
    clients.emplace_back([&] { running = completion(s.port, 4, false); });
    ++seen;
    ASSERT_TRUE(test::wait_until([&] { return s.stats().running == 1; }));
    test::RawClient raw(s.port);
    ASSERT_TRUE(raw.send(test::http_request(
        "POST", "/v1/completions",
        Json{{"model", "solo"}, {"prompt", "y"}, {"max_tokens", 100}, {"stream", stream}}.dump())));
    const auto queued_id = s.probe->submitted(seen++);
    ASSERT_TRUE(test::wait_until([&] { return s.stats().queued == 1; }));
    raw.close();
    ASSERT_TRUE(s.probe->wait_cancelled(queued_id));
    EXPECT_EQ(s.stats().queued, 0);  // left the queue without waiting for the engine
    ASSERT_TRUE(s.log.wait_for("499 client went away", stream ? 2 : 1));
    EXPECT_TRUE(test::wait_until([&] { return s.metric("slm_cancelled_total{specialist=\"solo\"}") == (stream ? 2 : 1); }));
    hold.unlock();
    clients.clear();
    ASSERT_TRUE(running);
    EXPECT_EQ(running->status, 200) << running->body;
  }
}

// Two HTTP threads, six clients: four connections wait for a thread while two requests hold both at the held engine;
// every client then gets the model's greedy answer.
TEST(ServerLimits, MoreClientsThanServerThreadsAllGetTheirAnswers) {
  ServerOptions so;
  so.threads = 2;
  SoloServer s({}, so);
  std::vector<int64_t> prompt = {2};
  for (uint32_t id : test::code512().encode("x")) prompt.push_back(id);
  const auto expected =
      test::text_of(test::greedy_reference(*s.solo().model.model, prompt, 4, test::chat_banned(), {3, 9}));
  constexpr int kClients = 6;
  std::vector<std::optional<httplib::Response>> answers(kClients);
  std::vector<std::jthread> clients;
  auto hold = test::hold_engine(s.solo());
  for (int i = 0; i < kClients; ++i) clients.emplace_back([&, i] { answers[i] = completion(s.port, 4, i % 2 == 1); });
  ASSERT_TRUE(test::wait_until([&] { return s.stats().running + s.stats().queued == 2; }));
  hold.unlock();
  clients.clear();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(answers[i]) << i;
    ASSERT_EQ(answers[i]->status, 200) << answers[i]->body;
    if (i % 2 == 0) {
      EXPECT_EQ(Json::parse(answers[i]->body)["choices"][0]["text"], expected) << i;
    } else {
      std::string text;
      for (size_t at = 0; (at = answers[i]->body.find("data: {", at)) != std::string::npos; at += 6) {
        const auto j = Json::parse(answers[i]->body.substr(at + 6, answers[i]->body.find("\n\n", at) - at - 6));
        if (!j["choices"].empty()) text += j["choices"][0]["text"].get<std::string>();
      }
      EXPECT_EQ(text, expected) << i;
    }
  }
  EXPECT_NE(s.probe->submitted(kClients - 1), 0u);  // all six reached the engine
}

// A client that stops sending in the middle of its request is cut by the read timeout (0.3 s here, 30 s by default:
// the raw client gives up after 10 s), with an error object.
TEST(ServerLimits, TheReadTimeoutCutsAStalledClient) {
  ServerOptions so;
  so.read_timeout_s = 0.3;
  SoloServer s({}, so);
  const std::string body = Json{{"model", "solo"}, {"prompt", "x"}, {"max_tokens", 2}}.dump();
  const std::string request = test::http_request("POST", "/v1/completions", body);
  const size_t head = request.find("\r\n\r\n") + 4;
  test::RawClient half_body(s.port, std::chrono::seconds(10)), half_head(s.port, std::chrono::seconds(10)),
      longer(s.port, std::chrono::seconds(10));
  ASSERT_TRUE(half_body.send(request.substr(0, head + body.size() / 2)));
  ASSERT_TRUE(half_head.send(request.substr(0, head / 2)));
  // A Content-Length larger than the body is the same stall.
  ASSERT_TRUE(longer.send(test::http_request("POST", "/v1/completions", body,
                                             "Content-Type: application/json\r\nContent-Length: " +
                                                 std::to_string(body.size() + 1) + "\r\n",
                                             false)));
  for (auto* raw : {&half_body, &longer}) {
    const auto r = raw->read_response();
    ASSERT_TRUE(r) << "not cut by the read timeout";
    test::expect_error(r->status, r->body, 400, "invalid_body", "", "did not arrive in full");
  }
  const auto r = half_head.read_response();
  ASSERT_TRUE(r) << "not cut by the read timeout";
  test::expect_error(r->status, r->body, 400, "", "", "did not arrive in full within the read timeout");
  auto ok = completion(s.port, 2, false);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// --api-key guards every endpoint but /health and the chat page, /metrics included. A refused request's body is read
// all the same, so a client that keeps its connection open gets the right answer to its next request.
TEST(ServerAuth, ApiKeyGuardsEverythingButHealthAndThePage) {
  ServerOptions so;
  so.api_key = "s3cret";
  SoloServer s({}, so);
  const httplib::Headers key = {{"Authorization", "Bearer s3cret"}};
  const std::string body = Json{{"model", "auto"}, {"prompt", "x"}, {"max_tokens", 2}}.dump();
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(60);
  c.set_keep_alive(true);
  auto refused = [](const httplib::Result& res) {
    ASSERT_TRUE(res);
    test::expect_error(res->status, res->body, 401, "invalid_api_key", "", "missing or wrong API key");
  };
  refused(c.Post("/v1/completions", body, "application/json"));
  refused(c.Post("/v1/completions", {{"Authorization", "Bearer s3cre"}}, body, "application/json"));
  refused(c.Post("/v1/completions", {{"Authorization", "s3cret"}}, body, "application/json"));
  refused(c.Get("/v1/models"));
  refused(c.Get("/metrics"));
  refused(c.Get("/v2/nothing"));       // no word on what exists without the key
  refused(c.Get("/v1/completions"));   // nor on its methods
  refused(c.Post("/v2/nothing", body, "application/json"));
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  auto res = c.Post("/v1/completions", key, body, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("X-SLM-Specialist"), "solo");  // one specialist: auto needs no router
  EXPECT_EQ(c.Get("/v1/models", key)->status, 200);
  auto metrics = c.Get("/metrics", key);
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  // The three POSTs and the GET refused above.
  EXPECT_NE(metrics->body.find("slm_http_requests_total{endpoint=\"/v1/completions\",status=\"401\"} 4"),
            std::string::npos)
      << metrics->body;
  EXPECT_EQ(c.Get("/v2/nothing", key)->status, 404);
  EXPECT_EQ(c.Get("/v1/completions", key)->status, 405);
  // One connection: a refused chunked body, then a request with the key.
  test::RawClient raw(s.port);
  ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/completions", test::chunked(body, 5),
                                          "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", false)));
  auto first = raw.read_response();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 401);
  ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/completions", body,
                                          "Content-Type: application/json\r\nAuthorization: Bearer s3cret\r\n")));
  auto second = raw.read_response();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, 200) << second->body;
}

// Ollama's clients print the "error" string they get: what is refused under /api/ before its handler runs (the key,
// an unknown path, a wrong method) is {"error": "..."} too, and OpenAI's object stays everywhere else. It was
// OpenAI's object on these paths before.
TEST(ServerAuth, OllamaPathsAreRefusedInOllamasShape) {
  ServerOptions so;
  so.api_key = "s3cret";
  SoloServer s({}, so);
  const httplib::Headers key = {{"Authorization", "Bearer s3cret"}};
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(60);
  auto ollama_error = [](const httplib::Result& res, int status, const std::string& what) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const Json j = Json::parse(res->body);
    ASSERT_TRUE(j.is_object() && j.size() == 1 && j["error"].is_string()) << res->body;
    EXPECT_NE(j["error"].get<std::string>().find(what), std::string::npos) << res->body;
  };
  ollama_error(c.Get("/api/tags"), 401, "missing or wrong API key");
  ollama_error(c.Post("/api/chat", R"({"model": "solo", "messages": []})", "application/json"), 401,
               "missing or wrong API key");
  ollama_error(c.Get("/api/nothing", key), 404, "no such endpoint: GET /api/nothing");
  ollama_error(c.Get("/api/chat", key), 405, "method not allowed (use POST)");
  auto openai = c.Get("/v1/nothing", key);
  ASSERT_TRUE(openai);
  test::expect_error(openai->status, openai->body, 404, "", "", "no such endpoint: GET /v1/nothing");
}

}  // namespace
}  // namespace slm::server
