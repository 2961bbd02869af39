// The OpenAI request parser and response builders of server/openai.h, without HTTP: every way a request is refused
// (status, message, param and code exactly as the client reads them), what an accepted request turns into field by
// field, and the response, chunk and error objects against hand-written JSON.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "slm/server/openai.h"

namespace slm::server {
namespace {

using Json = nlohmann::json;

// A chat body with one user message, extended by `extra`.
Json chat_body(Json extra = Json::object()) {
  Json j = {{"model", "alpha"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  j.update(extra);
  return j;
}

Json completion_body(Json extra = Json::object()) {
  Json j = {{"model", "alpha"}, {"prompt", "int main"}};
  j.update(extra);
  return j;
}

// Parses `body` expecting a refusal, and checks what the client would see: the status, the message, and the
// error object ({"error": {message, type, param, code}}, empty param and code sent as null).
void expect_refused(const std::string& body, bool chat, int status, const std::string& message,
                    const std::string& param, const std::string& code) {
  SCOPED_TRACE(body);
  try {
    parse_generation_request(body, chat);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status);
    EXPECT_EQ(std::string(e.what()), message);
    EXPECT_EQ(e.param(), param);
    EXPECT_EQ(e.code(), code);
    const Json expected = {{"error",
                            {{"message", message},
                             {"type", "invalid_request_error"},
                             {"param", param.empty() ? Json() : Json(param)},
                             {"code", code.empty() ? Json() : Json(code)}}}};
    EXPECT_EQ(e.to_json(), expected) << e.to_json().dump();
  }
}

// The common case: 400 invalid_value naming the field, the message prefixed by it.
void expect_invalid(const Json& body, bool chat, const std::string& param, const std::string& detail) {
  expect_refused(body.dump(), chat, 400, param + ": " + detail, param, "invalid_value");
}

void expect_unsupported(const Json& body, bool chat, const std::string& param) {
  expect_refused(body.dump(), chat, 400, param + ": not supported by this server", param, "unsupported_parameter");
}

GenerationRequest parse_chat(Json extra) {
  return parse_generation_request(chat_body(std::move(extra)).dump(), true);
}

TEST(OpenAIErrors, TypeFollowsTheStatus) {
  EXPECT_EQ(ApiError(400, "m").type(), "invalid_request_error");
  EXPECT_EQ(ApiError(413, "m").type(), "invalid_request_error");
  EXPECT_EQ(ApiError(401, "m").type(), "authentication_error");
  EXPECT_EQ(ApiError(404, "m").type(), "not_found_error");
  EXPECT_EQ(ApiError(429, "m").type(), "server_overloaded");
  EXPECT_EQ(ApiError(503, "m").type(), "server_overloaded");
  EXPECT_EQ(ApiError(500, "m").type(), "server_error");
  EXPECT_EQ(ApiError(504, "m").type(), "server_error");
}

TEST(OpenAIErrors, ErrorObjectCarriesParamAndCodeOrNull) {
  EXPECT_EQ(ApiError(404, "no such model", "model", "model_not_found").to_json(), Json::parse(R"({"error": {
    "message": "no such model", "type": "not_found_error", "param": "model", "code": "model_not_found"}})"));
  EXPECT_EQ(ApiError(503, "busy").to_json(), Json::parse(R"({"error": {
    "message": "busy", "type": "server_overloaded", "param": null, "code": null}})"));
}

TEST(OpenAIRequest, MalformedBodiesAreInvalidJson) {
  // The message carries the JSON library's own description of where parsing stopped.
  expect_refused("{", true, 400,
                 "the body is not valid JSON: [json.exception.parse_error.101] parse error at line 1, column 2: "
                 "syntax error while parsing object key - unexpected end of input; expected string literal",
                 "", "invalid_json");
  expect_refused("", false, 400,
                 "the body is not valid JSON: [json.exception.parse_error.101] parse error at line 1, column 1: "
                 "syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal",
                 "", "invalid_json");
  // A number past double's range is the JSON library's out_of_range, not a parse error: refused the same way.
  expect_refused(R"({"model": "a", "prompt": "x", "temperature": 1e400})", false, 400,
                 "the body is not valid JSON: [json.exception.out_of_range.406] number overflow parsing '1e400'", "",
                 "invalid_json");
  for (const char* body : {"[1, 2]", "\"text\"", "42", "null"})
    expect_refused(body, true, 400, "the body must be a JSON object", "", "invalid_json");
}

TEST(OpenAIRequest, ModelIsRequiredAsANonEmptyString) {
  const std::string detail = "required: a model name (GET /v1/models lists them)";
  for (bool chat : {true, false}) {
    Json body = chat ? chat_body() : completion_body();
    body.erase("model");
    expect_invalid(body, chat, "model", detail);
    for (const Json& bad : {Json(3), Json(""), Json(nullptr), Json::array({"alpha"})}) {
      body["model"] = bad;
      expect_invalid(body, chat, "model", detail);
    }
  }
}

TEST(OpenAIRequest, MessagesMustBeANonEmptyListOfRoleObjects) {
  Json body = chat_body();
  body.erase("messages");
  expect_invalid(body, true, "messages", "required: a non-empty list of messages");
  for (const Json& bad : {Json::array(), Json("hi"), Json::object(), Json(nullptr)}) {
    body["messages"] = bad;
    expect_invalid(body, true, "messages", "required: a non-empty list of messages");
  }
  // The index names the offending message; earlier good ones do not hide it.
  const Json good = {{"role", "user"}, {"content", "a"}};
  for (const Json& bad :
       {Json("hi"), Json::object({{"content", "a"}}), Json::object({{"role", 1}, {"content", "a"}})}) {
    body["messages"] = {good, bad};
    expect_invalid(body, true, "messages[1]", "expected an object with a string \"role\"");
  }
  body["messages"] = {{{"role", "bot"}, {"content", "a"}}};
  expect_invalid(body, true, "messages[0].role", "unknown role \"bot\" (system, developer, user, assistant, tool)");
  body["messages"] = {good, {{"role", "user"}}};
  expect_invalid(body, true, "messages[1].content", "required");
}

TEST(OpenAIRequest, ContentIsAStringNullOrTextParts) {
  Json body = chat_body();
  for (const Json& bad : {Json(7), Json(true), Json::object({{"type", "text"}, {"text", "a"}})}) {
    body["messages"] = {{{"role", "user"}, {"content", bad}}};
    expect_invalid(body, true, "messages[0].content", "expected a string or a list of text parts");
  }
  const std::string parts_only = "only {\"type\": \"text\", \"text\": \"...\"} parts are supported";
  for (const Json& bad_part : {Json("plain"), Json::object({{"type", "image_url"}, {"image_url", "x"}}),
                               Json::object({{"type", "text"}}), Json::object({{"type", "text"}, {"text", 5}}),
                               Json::object({{"text", "no type"}}), Json::object({{"type", 1}, {"text", "a"}})}) {
    body["messages"] = {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "ok"}}, bad_part}}}};
    expect_invalid(body, true, "messages[0].content[1]", parts_only);
  }

  // Accepted forms: parts are joined without a separator, null is an empty turn, and every role of the list.
  body["messages"] = {
      {{"role", "system"}, {"content", "sys"}},
      {{"role", "developer"}, {"content", {{{"type", "text"}, {"text", "ab"}}, {{"type", "text"}, {"text", "cd"}}}}},
      {{"role", "assistant"}, {"content", nullptr}},
      {{"role", "tool"}, {"content", "42"}},
      {{"role", "user"}, {"content", Json::array()}}};
  const auto r = parse_generation_request(body.dump(), true);
  ASSERT_EQ(r.messages.size(), 5u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"system", "sys"}, {"developer", "abcd"}, {"assistant", ""}, {"tool", "42"}, {"user", ""}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(r.messages[i].role, expected[i].first) << i;
    EXPECT_EQ(r.messages[i].content, expected[i].second) << i;
  }
}

TEST(OpenAIRequest, PromptIsAStringOrAListOfOneString) {
  Json body = completion_body();
  body.erase("prompt");
  expect_invalid(body, false, "prompt", "required: a string");
  const std::string detail = "expected a string (or a list of exactly one string; token-id prompts are not supported)";
  for (const Json& bad : {Json(nullptr), Json(3), Json::array(), Json::array({"a", "b"}), Json::array({1, 2, 3}),
                          Json::array({Json::array({1})}), Json::object()}) {
    body["prompt"] = bad;
    expect_invalid(body, false, "prompt", detail);
  }
  body["prompt"] = Json::array({"only one"});
  const auto r = parse_generation_request(body.dump(), false);
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.prompt, "only one");
  EXPECT_TRUE(r.messages.empty());
  // A chat request ignores "prompt", a completion request "messages": each endpoint reads its own field.
  body["prompt"] = "p";
  body["messages"] = "not checked";
  EXPECT_EQ(parse_generation_request(body.dump(), false).prompt, "p");
  EXPECT_EQ(parse_chat({{"prompt", 5}}).prompt, "");
}

TEST(OpenAIRequest, MaxTokensIsAPositiveInteger) {
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    for (const Json& bad : {Json(2.5), Json(3.0), Json("3"), Json(true), Json::array({3})})
      expect_invalid(chat_body({{key, bad}}), true, key, "expected an integer");
    for (const Json& bad : {Json(0), Json(-1), Json(std::numeric_limits<int64_t>::min())})
      expect_invalid(chat_body({{key, bad}}), true, key, "must be at least 1");
    EXPECT_EQ(parse_chat({{key, 1}}).max_tokens, 1);
    EXPECT_EQ(parse_chat({{key, std::numeric_limits<int64_t>::max()}}).max_tokens,
              std::numeric_limits<int64_t>::max());  // the context check (prepare_generation) refuses it later
    EXPECT_FALSE(parse_chat({{key, nullptr}}).max_tokens.has_value());
  }
  EXPECT_FALSE(parse_chat(Json::object()).max_tokens.has_value());
  // Both given: max_completion_tokens (OpenAI's current name) is read last and wins.
  EXPECT_EQ(parse_chat({{"max_tokens", 5}, {"max_completion_tokens", 7}}).max_tokens, 7);
  // Past int64 (nlohmann keeps it as uint64): refused as more than any context, not wrapped to a negative number.
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    for (const char* huge : {"9223372036854775808", "18446744073709551615"})
      expect_refused(R"({"model": "a", "prompt": "x", ")" + std::string(key) + "\": " + huge + "}", false, 400,
                     std::string(key) + ": " + huge + " is more tokens than any model's context", key,
                     "context_length_exceeded");
}

TEST(OpenAIRequest, TemperatureAndTopPRanges) {
  for (const Json& bad : {Json("0.5"), Json(true), Json::array()})
    expect_invalid(chat_body({{"temperature", bad}}), true, "temperature", "expected a number");
  for (double bad : {-0.001, 2.001, 100.0})
    expect_invalid(chat_body({{"temperature", bad}}), true, "temperature", "must be in [0, 2]");
  EXPECT_EQ(parse_chat({{"temperature", 0}}).sampling.temperature, 0.0);
  EXPECT_EQ(parse_chat({{"temperature", 2}}).sampling.temperature, 2.0);
  EXPECT_EQ(parse_chat({{"temperature", nullptr}}).sampling.temperature, 1.0);  // null: the default

  for (const Json& bad : {Json("1"), Json(false)})
    expect_invalid(chat_body({{"top_p", bad}}), true, "top_p", "expected a number");
  for (double bad : {0.0, -0.5, 1.0001})
    expect_invalid(chat_body({{"top_p", bad}}), true, "top_p", "must be in (0, 1]");
  EXPECT_EQ(parse_chat({{"top_p", 1}}).sampling.top_p, 1.0);
  EXPECT_EQ(parse_chat({{"top_p", 0.25}}).sampling.top_p, 0.25);
}

TEST(OpenAIRequest, TopKAcceptsMinusOneAndZeroAsNoLimit) {
  for (const Json& bad : {Json(1.5), Json("4")})
    expect_invalid(chat_body({{"top_k", bad}}), true, "top_k", "expected an integer");
  for (int bad : {-2, -100})
    expect_invalid(chat_body({{"top_k", bad}}), true, "top_k", "must be -1 or 0 (no limit) or positive");
  EXPECT_EQ(parse_chat({{"top_k", -1}}).sampling.top_k, 0);
  EXPECT_EQ(parse_chat({{"top_k", 0}}).sampling.top_k, 0);
  EXPECT_EQ(parse_chat({{"top_k", 40}}).sampling.top_k, 40);
  // Past int64 it saturates (no limit in effect) instead of wrapping to a negative, refused value.
  EXPECT_EQ(parse_chat(Json::parse(R"({"top_k": 18446744073709551615})")).sampling.top_k,
            std::numeric_limits<int64_t>::max());
}

TEST(OpenAIRequest, PenaltyRanges) {
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    expect_invalid(chat_body({{key, "1"}}), true, key, "expected a number");
    for (double bad : {2.01, -2.01}) expect_invalid(chat_body({{key, bad}}), true, key, "must be in [-2, 2]");
  }
  const auto edges = parse_chat({{"presence_penalty", -2}, {"frequency_penalty", 2}}).sampling;
  EXPECT_EQ(edges.presence_penalty, -2.0);
  EXPECT_EQ(edges.frequency_penalty, 2.0);

  expect_invalid(chat_body({{"repetition_penalty", "1.1"}}), true, "repetition_penalty", "expected a number");
  for (double bad : {0.0, -1.0, 10.5})
    expect_invalid(chat_body({{"repetition_penalty", bad}}), true, "repetition_penalty", "must be in (0, 10]");
  EXPECT_EQ(parse_chat({{"repetition_penalty", 10}}).sampling.repetition_penalty, 10.0);
}

TEST(OpenAIRequest, SeedNAndStop) {
  for (const Json& bad : {Json(1.5), Json("7")})
    expect_invalid(chat_body({{"seed", bad}}), true, "seed", "expected an integer");
  EXPECT_EQ(parse_chat({{"seed", 12345}}).sampling.seed, 12345u);
  // A negative seed is kept as its two's-complement bits: still a fixed, reproducible seed.
  EXPECT_EQ(parse_chat({{"seed", -1}}).sampling.seed, 18446744073709551615ull);

  for (const Json& bad : {Json(1.0), Json("1")})
    expect_invalid(chat_body({{"n", bad}}), true, "n", "expected an integer");
  for (int bad : {0, 2, 5}) expect_invalid(chat_body({{"n", bad}}), true, "n", "only n = 1 is supported");
  // 2^64 + 1 would wrap to 1 if read modulo 2^64; it is far from 1 (and beyond uint64: a float, not an integer).
  expect_invalid(chat_body(Json::parse(R"({"n": 18446744073709551617})")), true, "n", "expected an integer");
  expect_invalid(chat_body(Json::parse(R"({"n": 18446744073709551615})")), true, "n", "only n = 1 is supported");
  EXPECT_NO_THROW(parse_chat({{"n", 1}}));

  const std::string stop_detail = "expected a string or a list of up to 4 strings";
  for (const Json& bad : {Json(3), Json::array({"a", "b", "c", "d", "e"}), Json::array({"a", 1}), Json::object(),
                          Json::array({Json::array({"a"})})})
    expect_invalid(chat_body({{"stop", bad}}), true, "stop", stop_detail);
  EXPECT_EQ(parse_chat({{"stop", "\n\n"}}).stop, std::vector<std::string>({"\n\n"}));
  EXPECT_EQ(parse_chat({{"stop", {"a", "b", "c", "d"}}}).stop, std::vector<std::string>({"a", "b", "c", "d"}));
  EXPECT_TRUE(parse_chat({{"stop", Json::array()}}).stop.empty());
  EXPECT_TRUE(parse_chat({{"stop", nullptr}}).stop.empty());
}

TEST(OpenAIRequest, StreamAndStreamOptions) {
  for (const Json& bad : {Json("true"), Json(1)})
    expect_invalid(chat_body({{"stream", bad}}), true, "stream", "expected true or false");
  for (const Json& bad : {Json(true), Json("x"), Json::array()})
    expect_invalid(chat_body({{"stream_options", bad}}), true, "stream_options", "expected an object");
  expect_invalid(chat_body({{"stream_options", {{"include_usage", 1}}}}), true, "stream_options.include_usage",
                 "expected true or false");
  const auto r = parse_chat({{"stream", true}, {"stream_options", {{"include_usage", true}}}});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  const auto plain = parse_chat({{"stream", false}, {"stream_options", Json::object()}});
  EXPECT_FALSE(plain.stream);
  EXPECT_FALSE(plain.include_usage);
}

TEST(OpenAIRequest, FeaturesTheServerLacksAreRefusedOnlyWhenAskedFor) {
  for (bool chat : {true, false}) {
    const auto body = [&](Json extra) {
      return chat ? chat_body(std::move(extra)) : completion_body(std::move(extra));
    };
    for (const char* key : {"logprobs", "echo"}) {
      for (const Json& on : {Json(true), Json(1), Json(5)}) expect_unsupported(body({{key, on}}), chat, key);
      for (const Json& off : {Json(false), Json(0), Json(nullptr)})
        EXPECT_NO_THROW(parse_generation_request(body({{key, off}}).dump(), chat)) << key << " " << off;
    }
    expect_unsupported(body({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}), chat, "tools");
    expect_unsupported(body({{"functions", {{{"name", "f"}}}}}), chat, "functions");
    expect_unsupported(body({{"best_of", 2}}), chat, "best_of");
    EXPECT_NO_THROW(parse_generation_request(body({{"best_of", 1}}).dump(), chat));
    if (chat) {
      expect_unsupported(body({{"suffix", "}"}}), chat, "suffix");
    } else {  // completions fill in the middle (docs/serving.md)
      EXPECT_EQ(parse_generation_request(body({{"suffix", "}"}}).dump(), chat).suffix, std::optional<std::string>("}"));
      EXPECT_THROW(parse_generation_request(body({{"suffix", 3}}).dump(), chat), ApiError);
    }
    expect_unsupported(body({{"top_logprobs", 3}}), chat, "top_logprobs");
    expect_unsupported(body({{"response_format", {{"type", "json_object"}}}}), chat, "response_format");
    expect_unsupported(body({{"response_format", "text"}}), chat, "response_format");
    expect_unsupported(body({{"response_format", {{"type", 3}}}}), chat, "response_format");  // not a 500
    EXPECT_NO_THROW(parse_generation_request(body({{"response_format", {{"type", "text"}}}}).dump(), chat));
    for (const char* key : {"tools", "functions", "best_of", "suffix", "top_logprobs", "response_format"})
      EXPECT_NO_THROW(parse_generation_request(body({{key, nullptr}}).dump(), chat)) << key;
    // Fields with no effect here are ignored, as other OpenAI-compatible servers do.
    EXPECT_NO_THROW(parse_generation_request(body({{"user", "u-1"}, {"metadata", {{"k", "v"}}}}).dump(), chat));
  }
}

TEST(OpenAIRequest, AcceptedChatRequestFieldByField) {
  const auto r = parse_generation_request(R"({
      "model": "cmake", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
      "max_tokens": 12, "temperature": 0.5, "top_p": 0.75, "top_k": 7, "presence_penalty": 0.25,
      "frequency_penalty": -0.5, "repetition_penalty": 1.5, "seed": 99, "n": 1, "stop": ["END", "\n"],
      "stream": true, "stream_options": {"include_usage": true}})",
                                          true);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "cmake");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "be brief");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "hi");
  EXPECT_EQ(r.prompt, "");
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_EQ(r.sampling.temperature, 0.5);
  EXPECT_EQ(r.sampling.top_p, 0.75);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_EQ(r.sampling.seed, 99u);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.5);
  EXPECT_EQ(r.sampling.presence_penalty, 0.25);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r.stop, std::vector<std::string>({"END", "\n"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);

  // Nothing but the required fields: every option at its default.
  const auto d = parse_generation_request(R"({"model": "m", "prompt": "x"})", false);
  EXPECT_EQ(d.model, "m");
  EXPECT_EQ(d.prompt, "x");
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.sampling.temperature, 1.0);
  EXPECT_EQ(d.sampling.top_p, 1.0);
  EXPECT_EQ(d.sampling.top_k, 0);
  EXPECT_EQ(d.sampling.seed, 0u);
  EXPECT_EQ(d.sampling.repetition_penalty, 1.0);
  EXPECT_EQ(d.sampling.presence_penalty, 0.0);
  EXPECT_EQ(d.sampling.frequency_penalty, 0.0);
  EXPECT_TRUE(d.stop.empty());
  EXPECT_FALSE(d.stream);
  EXPECT_FALSE(d.include_usage);
}

TEST(OpenAIRequest, RoutingTextIsTheLastUserMessageOrThePrompt) {
  GenerationRequest g;
  g.messages = {{"system", "s"}, {"user", "first"}, {"assistant", "a"}, {"user", "second"}, {"assistant", "b"}};
  EXPECT_EQ(g.routing_text(), "second");
  g.messages = {{"system", "only system"}, {"assistant", "last"}};
  EXPECT_EQ(g.routing_text(), "last");  // no user turn: the last message
  g.messages.clear();
  EXPECT_EQ(g.routing_text(), "");
  g.chat = false;
  g.prompt = "the prompt";
  g.messages = {{"user", "ignored"}};
  EXPECT_EQ(g.routing_text(), "the prompt");
}

Completion sample_completion() {
  Completion c;
  c.id = "chatcmpl-7";
  c.model = "auto";
  c.specialist = "cmake";
  c.created = 1764547200;
  c.text = "add_library(foo)";
  c.finish_reason = "length";
  c.prompt_tokens = 11;
  c.completion_tokens = 4;
  return c;
}

TEST(OpenAIResponse, ChatCompletionObject) {
  // OpenAI's chat.completion: message.refusal is required (null allowed); system_fingerprint is a string when
  // present, so it is left out.
  EXPECT_EQ(completion_json(sample_completion(), true), Json::parse(R"json({
    "id": "chatcmpl-7", "object": "chat.completion", "created": 1764547200, "model": "auto", "specialist": "cmake",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "add_library(foo)", "refusal": null},
                 "logprobs": null, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}})json"))
      << completion_json(sample_completion(), true).dump();
}

TEST(OpenAIResponse, TextCompletionObjectWithRouting) {
  auto c = sample_completion();
  c.id = "cmpl-3";
  c.finish_reason = "stop";
  c.routing = {{"cmake", 0.75}, {"shell", 0.25}};
  EXPECT_EQ(completion_json(c, false), Json::parse(R"json({
    "id": "cmpl-3", "object": "text_completion", "created": 1764547200, "model": "auto", "specialist": "cmake",
    "routing": {"cmake": 0.75, "shell": 0.25},
    "choices": [{"index": 0, "text": "add_library(foo)", "logprobs": null, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}})json"))
      << completion_json(c, false).dump();
}

TEST(OpenAIResponse, ChatStreamChunks) {
  auto c = sample_completion();
  c.finish_reason = "stop";
  const Json head = {{"id", "chatcmpl-7"},
                     {"object", "chat.completion.chunk"},
                     {"created", 1764547200},
                     {"model", "auto"},
                     {"specialist", "cmake"}};
  auto with = [&](Json choices) {
    Json j = head;
    j["choices"] = std::move(choices);
    return j;
  };
  // The first chunk names the role, later ones carry only text, the last one only the finish reason.
  EXPECT_EQ(chunk_json(c, true, "add_", true, false),
            with(Json::parse(R"([{"index": 0, "delta": {"role": "assistant", "content": "add_"},
                                  "logprobs": null, "finish_reason": null}])")));
  EXPECT_EQ(chunk_json(c, true, "library", false, false),
            with(Json::parse(R"([{"index": 0, "delta": {"content": "library"}, "logprobs": null,
                                  "finish_reason": null}])")));
  EXPECT_EQ(chunk_json(c, true, "", false, true),
            with(Json::parse(R"([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}])")));
  // A stream whose first chunk is also its last (nothing generated): the role, no content.
  EXPECT_EQ(chunk_json(c, true, "", true, true),
            with(Json::parse(R"([{"index": 0, "delta": {"role": "assistant"}, "logprobs": null,
                                  "finish_reason": "stop"}])")));
  Json usage = head;
  usage["choices"] = Json::array();
  usage["usage"] = {{"prompt_tokens", 11}, {"completion_tokens", 4}, {"total_tokens", 15}};
  EXPECT_EQ(chunk_json(c, true, "", false, false, true), usage);
}

TEST(OpenAIResponse, TextCompletionStreamChunks) {
  auto c = sample_completion();
  c.id = "cmpl-3";
  c.routing = {{"cmake", 1.0}};
  const Json head = {{"id", "cmpl-3"},  {"object", "text_completion"}, {"created", 1764547200},
                     {"model", "auto"}, {"specialist", "cmake"},       {"routing", {{"cmake", 1.0}}}};
  Json piece = head;
  piece["choices"] = Json::parse(R"([{"index": 0, "text": "foo", "logprobs": null, "finish_reason": null}])");
  EXPECT_EQ(chunk_json(c, false, "foo", true, false), piece);
  Json last = head;
  last["choices"] = Json::parse(R"([{"index": 0, "text": "", "logprobs": null, "finish_reason": "length"}])");
  EXPECT_EQ(chunk_json(c, false, "", false, true), last);
  Json usage = head;
  usage["choices"] = Json::array();
  usage["usage"] = {{"prompt_tokens", 11}, {"completion_tokens", 4}, {"total_tokens", 15}};
  EXPECT_EQ(chunk_json(c, false, "", false, false, true), usage);
}

}  // namespace
}  // namespace slm::server
