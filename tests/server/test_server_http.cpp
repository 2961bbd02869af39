// The HTTP framing of slm serve's requests, sent byte by byte on raw sockets: bodies at and over the size limit with a
// Content-Length and chunked, false and missing lengths, Content-Types, methods, and clients that send half a
// request. Each answer has its exact status and OpenAI error object, and a connection whose request was refused
// stays usable for the next one.
#include <gtest/gtest.h>
#include <httplib.h>

#include "engine/engine_test_util.h"
#include "serving_test_util.h"
#include "slm/server/http_server.h"
#include "test_server_util.h"

namespace slm::server {
namespace {

using Json = nlohmann::json;

constexpr size_t kLimit = 4096;  // the server's --max-body here

class ServerHttp : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::single_threaded();
    specialists_ = new Specialists();
    specialists_->add("solo", test::serving_model(41, 512),
                      std::make_unique<data::Tokenizer>(
                          data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model"))),
                      {"solo"}, LoadOptions{});
    ServerOptions so;
    so.port = 0;
    so.threads = 8;
    so.max_body_bytes = kLimit;
    server_ = new Server(*specialists_, so);
    port_ = server_->start();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete specialists_;
  }

  static std::string body(const std::string& prompt = "int main() {") {
    return Json{{"model", "solo"}, {"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}}.dump();
  }
  // A valid body of exactly `size` bytes (JSON allows the trailing spaces).
  static std::string body_of_size(size_t size) {
    std::string b = body();
    return b + std::string(size - b.size(), ' ');
  }
  static std::string chunked_request(const std::string& b, size_t piece) {
    return test::http_request("POST", "/v1/completions", test::chunked(b, piece),
                              "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", false);
  }
  // The greedy answer to body() as the server gives it to cpp-httplib's own client.
  static std::string answer() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60);
    auto res = c.Post("/v1/completions", body(), "application/json");
    EXPECT_TRUE(res && res->status == 200);
    return res ? Json::parse(res->body)["choices"][0]["text"].get<std::string>() : "";
  }
  static void expect_answer(const std::optional<test::RawResponse>& r, const std::string& text) {
    ASSERT_TRUE(r) << "no answer";
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(Json::parse(r->body)["choices"][0]["text"], text);
  }

  static inline Specialists* specialists_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
};

// cpp-httplib's own limit covered a Content-Length only: a chunked body of any size was read and answered. The
// refused body is still read whole, so the same connection answers the next request.
TEST_F(ServerHttp, ABodyAtTheLimitIsReadAndOneByteMoreIs413WithALengthOrChunked) {
  const std::string text = answer();
  for (bool chunked : {false, true}) {
    SCOPED_TRACE(chunked ? "chunked" : "Content-Length");
    test::RawClient raw(port_);
    for (size_t size : {kLimit, kLimit + 1, kLimit * 4, kLimit}) {
      const std::string b = body_of_size(size);
      ASSERT_TRUE(raw.send(chunked ? chunked_request(b, 1000) : test::http_request("POST", "/v1/completions", b)));
      const auto r = raw.read_response();
      if (size == kLimit) {
        expect_answer(r, text);
      } else {
        ASSERT_TRUE(r) << size;
        test::expect_error(r->status, r->body, 413, "body_too_large", "", "larger than 4096 bytes");
      }
    }
  }
}

TEST_F(ServerHttp, AChunkedBodyIsAnsweredAsTheSameBodyWithALength) {
  const std::string text = answer();
  test::RawClient raw(port_);
  for (size_t piece : {size_t{1}, size_t{7}, kLimit}) {
    ASSERT_TRUE(raw.send(chunked_request(body(), piece)));
    expect_answer(raw.read_response(), text);
  }
}

// A Content-Length shorter than the body cuts the JSON; one that is no number leaves the body's end unknown (cpp-httplib
// read "-1" as 2^64 - 1 bytes to skip, and "abc" as none); without a length (or chunks) a request has no body.
TEST_F(ServerHttp, AFalseOrMissingContentLengthIsRefused) {
  {
    test::RawClient raw(port_);
    const std::string b = body();
    ASSERT_TRUE(raw.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                         std::to_string(b.size() - 5) + "\r\n\r\n" + b));
    const auto r = raw.read_response();
    ASSERT_TRUE(r);
    test::expect_error(r->status, r->body, 400, "invalid_json", "", "not valid JSON");
  }
  for (const std::string length : {"abc", "-1", "12abc", "0x10", "1 2"}) {
    SCOPED_TRACE("Content-Length: " + length);
    test::RawClient raw(port_);
    ASSERT_TRUE(raw.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                         length + "\r\n\r\n" + body()));
    const auto r = raw.read_response();
    ASSERT_TRUE(r);
    test::expect_error(r->status, r->body, 400, "invalid_body", "", "is not a number of bytes");
  }
  {
    test::RawClient raw(port_);
    ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/completions", body(), "Content-Type: application/json\r\n",
                                            false)));
    const auto r = raw.read_response();
    ASSERT_TRUE(r);
    test::expect_error(r->status, r->body, 411, "length_required", "", "needs a Content-Length");
  }
}

// The body is JSON; a form or multipart body is refused by its Content-Type rather than by a JSON parse error. It is
// read whole all the same: the connection answers the next request.
TEST_F(ServerHttp, ABodyThatIsNotJsonByItsContentTypeIs415) {
  const std::string text = answer();
  const std::string multipart =
      "--xyz\r\nContent-Disposition: form-data; name=\"request\"\r\n\r\n" + body() + "\r\n--xyz--\r\n";
  for (const std::string type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz",
                                 "application/jsonx", "text/json"}) {
    SCOPED_TRACE(type);
    test::RawClient raw(port_);
    const std::string b = type.rfind("multipart", 0) == 0 ? multipart : body();
    ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/completions", b, "Content-Type: " + type + "\r\n")));
    const auto r = raw.read_response();
    ASSERT_TRUE(r);
    test::expect_error(r->status, r->body, 415, "unsupported_media_type", "",
                       "Content-Type must be application/json (got \"" + type + "\")");
    ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/completions", body())));
    expect_answer(raw.read_response(), text);
  }
  for (const std::string headers : {"Content-Type: application/json; charset=utf-8\r\n",
                                    "Content-Type: Application/JSON\r\n",
                                    "Content-Type: application/vnd.api+json\r\n", ""}) {
    SCOPED_TRACE(headers);
    test::RawClient raw(port_);
    ASSERT_TRUE(raw.send(test::http_request("POST", "/v1/completions", body(), headers)));
    expect_answer(raw.read_response(), text);
  }
}

TEST_F(ServerHttp, AWrongMethodIs405WithAllow) {
  struct Case {
    std::string method, path, allow;
  };
  for (const auto& c : std::vector<Case>{{"GET", "/v1/chat/completions", "POST"},
                                         {"GET", "/v1/completions", "POST"},
                                         {"PUT", "/v1/chat/completions", "POST"},
                                         {"DELETE", "/v1/completions", "POST"},
                                         {"POST", "/v1/models", "GET"},
                                         {"POST", "/health", "GET"},
                                         {"POST", "/metrics", "GET"},
                                         {"PATCH", "/", "GET"}}) {
    SCOPED_TRACE(c.method + " " + c.path);
    test::RawClient raw(port_);
    ASSERT_TRUE(raw.send(test::http_request(c.method, c.path, c.method == "GET" ? "" : body())));
    const auto r = raw.read_response();
    ASSERT_TRUE(r);
    test::expect_error(r->status, r->body, 405, "method_not_allowed", "",
                       c.method + " " + c.path + ": method not allowed (use " + c.allow + ")");
    EXPECT_EQ(r->header("allow"), c.allow);
  }
  test::RawClient raw(port_);
  ASSERT_TRUE(raw.send(test::http_request("GET", "/v1/chat", "")));
  const auto r = raw.read_response();
  ASSERT_TRUE(r);
  test::expect_error(r->status, r->body, 404, "", "", "no such endpoint: GET /v1/chat");
}

// Each open connection holds one HTTP thread while its request is read: clients that have sent half a request (head
// or body) wait on theirs, the others are answered meanwhile, and the slow ones are answered once they send the rest
// (the read timeout, 30 s here, is not reached).
TEST_F(ServerHttp, AHalfSentRequestBlocksNoOtherClient) {
  const std::string text = answer();
  const std::string request = test::http_request("POST", "/v1/completions", body());
  const size_t head = request.find("\r\n\r\n") + 4;
  test::RawClient half_body(port_), half_head(port_);
  ASSERT_TRUE(half_body.send(request.substr(0, head + 10)));
  ASSERT_TRUE(half_head.send(request.substr(0, head / 2)));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(answer(), text);
  EXPECT_TRUE(half_body.silent());
  EXPECT_TRUE(half_head.silent());
  ASSERT_TRUE(half_body.send(request.substr(head + 10)));
  expect_answer(half_body.read_response(), text);
  ASSERT_TRUE(half_head.send(request.substr(head / 2)));
  expect_answer(half_head.read_response(), text);
}

}  // namespace
}  // namespace slm::server
