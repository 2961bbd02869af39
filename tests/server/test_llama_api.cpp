// llama.cpp's /tokenize, /detokenize and /props on slm serve (the shapes of llama.cpp's tools/server/README.md; ids
// from tokenizer/README.md's 512-id code tokenizer), and response_fields' flattening (json_get_nested_values).
#include <gtest/gtest.h>
#include <httplib.h>

#include "engine/engine_test_util.h"
#include "serving_test_util.h"
#include "slm/server/http_server.h"
#include "slm/server/llama_api.h"

namespace slm::server {
namespace {

using Json = nlohmann::json;

class LlamaApi : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::single_threaded();
    specialists_ = new Specialists();
    specialists_->add(
        "solo", test::serving_model(41, 512),
        std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model"))),
        {"solo"}, LoadOptions{});
    ServerOptions so;
    so.port = 0;
    server_ = new Server(*specialists_, so);
    port_ = server_->start();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete specialists_;
  }
  static std::pair<int, Json> post(const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Post(path.c_str(), body, "application/json");
    if (!r) return {0, {}};
    return {r->status, Json::parse(r->body, nullptr, false)};
  }
  static inline Specialists* specialists_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline int port_ = 0;
};

TEST_F(LlamaApi, TokenizeAndDetokenize) {
  const auto ids = test::code512().encode("int x;");
  Json want = Json::array();
  for (uint32_t id : ids) want.push_back(id);
  auto [status, r] = post("/tokenize", R"({"content": "int x;"})");
  ASSERT_EQ(status, 200) << r;
  EXPECT_EQ(r, Json({{"tokens", want}}));
  // add_special: <|bos|> (2) first.
  std::tie(status, r) = post("/tokenize", R"({"content": "int x;", "add_special": true})");
  EXPECT_EQ(r["tokens"][0], 2);
  EXPECT_EQ(r["tokens"].size(), ids.size() + 1);
  // with_pieces: {id, piece}, the pieces spelling the text.
  std::tie(status, r) = post("/tokenize", R"({"content": "int x;", "with_pieces": true})");
  ASSERT_EQ(status, 200) << r;
  std::string spelled;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(r["tokens"][i]["id"], ids[i]);
    spelled += r["tokens"][i]["piece"].get<std::string>();
  }
  EXPECT_EQ(spelled, "int x;");
  std::tie(status, r) = post("/detokenize", Json({{"tokens", want}}).dump());
  ASSERT_EQ(status, 200) << r;
  EXPECT_EQ(r, Json({{"content", "int x;"}}));
  // Bad input: 400 naming the field.
  for (const auto& [path, body, param] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"/tokenize", "{}", "content"},
           {"/tokenize", R"({"content": 5})", "content"},
           {"/tokenize", R"({"content": "a", "add_special": "yes"})", "add_special"},
           {"/detokenize", R"({"tokens": "1 2"})", "tokens"},
           {"/detokenize", R"({"tokens": [1, 512]})", "tokens"},
           {"/detokenize", R"({"tokens": [-1]})", "tokens"}}) {
    std::tie(status, r) = post(path, body);
    EXPECT_EQ(status, 400) << path << " " << body;
    EXPECT_EQ(r["error"]["param"], param) << path << " " << body << " " << r;
  }
}

// What llama.vscode reads from /props (src/language-model-token-limits.ts: default_generation_settings.n_ctx).
TEST_F(LlamaApi, Props) {
  httplib::Client c("127.0.0.1", port_);
  auto r = c.Get("/props");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const Json j = Json::parse(r->body);
  EXPECT_EQ(j["default_generation_settings"]["n_ctx"], 512);
  EXPECT_EQ(j["total_slots"], 1);
  EXPECT_EQ(j["model_path"], "random");
  EXPECT_EQ(j["infill_order"], "spm");
  // The method table knows it: POST is a 405 naming GET.
  auto wrong = c.Post("/props", "{}", "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->get_header_value("Allow"), "GET");
}

// llama.cpp's json_get_nested_values: the flattened name is the key; a path that leads nowhere is left out.
TEST(LlamaApiFields, SelectFieldsFlattens) {
  const Json full = {{"content", "x"}, {"timings", {{"prompt_n", 3}, {"predicted_ms", 1.5}}}, {"truncated", false}};
  EXPECT_EQ(select_fields(full, {"content", "timings/prompt_n", "truncated"}),
            Json({{"content", "x"}, {"timings/prompt_n", 3}, {"truncated", false}}));
  EXPECT_EQ(select_fields(full, {""}), Json::object());
  EXPECT_EQ(select_fields(full, {"timings/nope", "content/x", "nope"}), Json::object());
  EXPECT_EQ(select_fields(full, {"timings"}), Json({{"timings", full["timings"]}}));
}

// A request refused before routing (no API key) is counted under its path only when the path is the server's: any
// other counts as "other", so that clients cannot grow the metrics' label set.
TEST(LlamaApiMetrics, UnknownPathsCountAsOther) {
  test::single_threaded();
  Specialists specialists;
  specialists.add(
      "solo", test::serving_model(41, 512),
      std::make_unique<data::Tokenizer>(data::Tokenizer::load(test::source_path("tokenizer/slm-code-512.model"))),
      {"solo"}, LoadOptions{});
  ServerOptions so;
  so.port = 0;
  so.api_key = "k";
  Server server(specialists, so);
  httplib::Client c("127.0.0.1", server.start());
  for (const char* path : {"/v2/one", "/v2/two", "/props"}) EXPECT_EQ(c.Get(path)->status, 401) << path;
  auto m = c.Get("/metrics", {{"Authorization", "Bearer k"}});
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("slm_http_requests_total{endpoint=\"other\",status=\"401\"} 2\n"), std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("slm_http_requests_total{endpoint=\"/props\",status=\"401\"} 1\n"), std::string::npos)
      << m->body;
  EXPECT_EQ(m->body.find("/v2/"), std::string::npos) << m->body;
}

}  // namespace
}  // namespace slm::server
