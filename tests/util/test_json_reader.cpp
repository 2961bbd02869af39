// util/json_reader.h: JSON syntax errors as file:line:column, file reading errors, and the strict object reader's
// typed getters, fallbacks, dotted paths and unknown-key rejection, each message exactly as a user reads it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "slm/util/json_reader.h"

namespace slm {
namespace {

using Json = nlohmann::json;

// The message of the slm::Error `f` throws ("" and a test failure when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/json_reader_" + std::to_string(getpid()) + "_" + name;
}

TEST(JsonText, SyntaxErrorsNameSourceLineAndColumn) {
  // The column is the offending byte's, counted from 1 after the last newline.
  EXPECT_EQ(error_of([] { parse_json_text("{\"a\": 1,\n \"b\": }", "r.json"); }),
            "r.json:2:7: malformed JSON: syntax error while parsing value - unexpected '}'; expected '[', '{', or a "
            "literal");
  EXPECT_EQ(error_of([] { parse_json_text("[1, 2,\n\n  x]", "r.json"); }),
            "r.json:3:3: malformed JSON: syntax error while parsing value - invalid literal; last read: "
            "'2,<U+000A><U+000A>  x'");
  // Cut short: the position just past the last byte.
  EXPECT_EQ(error_of([] { parse_json_text("{\"a\": ", "cut.json"); }),
            "cut.json:1:7: malformed JSON: syntax error while parsing value - unexpected end of input; expected '[', "
            "'{', or a literal");
  EXPECT_EQ(error_of([] { parse_json_text("", "empty.json"); }),
            "empty.json:1:1: malformed JSON: syntax error while parsing value - unexpected end of input; expected "
            "'[', '{', or a literal");
  // Trailing text after a complete value is an error too, not silently ignored.
  EXPECT_EQ(error_of([] { parse_json_text("{\"a\":1} x", "t.json"); }),
            "t.json:1:9: malformed JSON: syntax error while parsing value - invalid literal; last read: '1} x'; "
            "expected end of input");
  // A number past double's range: the library gives no position, the message still names the source.
  EXPECT_EQ(error_of([] { parse_json_text("{\n \"x\": -1e999}", "n.json"); }),
            "n.json: malformed JSON: number overflow parsing '-1e999'");
  EXPECT_EQ(parse_json_text(" {\"a\": [1, 2.5, \"s\"]}\n", "ok.json"), Json::parse(R"({"a": [1, 2.5, "s"]})"));
}

TEST(JsonText, FilesThatCannotBeReadAreErrorsNamingThem) {
  const std::string missing = temp_path("missing.json");
  EXPECT_EQ(error_of([&] { read_text_file(missing); }), missing + ": cannot open file");
  EXPECT_EQ(error_of([&] { parse_json_file(missing); }), missing + ": cannot open file");
  // A directory opens as a stream on Linux but cannot be read: that must not pass for an empty file.
  const std::string dir = temp_path("dir");
  std::filesystem::create_directories(dir);
  EXPECT_EQ(error_of([&] { read_text_file(dir); }), dir + ": read error");

  const std::string bad = temp_path("bad.json");
  // Line 3 is `  "name" "x"`: the parser stops at the closing quote of "x", column 12.
  std::ofstream(bad, std::ios::binary) << "{\n  \"depth\": 12,\n  \"name\" \"x\"\n}\n";
  EXPECT_EQ(error_of([&] { parse_json_file(bad); }),
            bad +
                ":3:12: malformed JSON: syntax error while parsing object separator - unexpected string literal; "
                "expected ':'");
  // Bytes come back exactly, NUL and CR included (binary mode).
  const std::string raw = temp_path("raw.txt");
  const std::string bytes("a\r\nb\0c", 6);
  std::ofstream(raw, std::ios::binary) << bytes;
  EXPECT_EQ(read_text_file(raw), bytes);
  const std::string empty = temp_path("empty.txt");
  std::ofstream(empty, std::ios::binary).close();
  EXPECT_EQ(read_text_file(empty), "");
  std::filesystem::remove(bad);
  std::filesystem::remove(raw);
  std::filesystem::remove(empty);
  std::filesystem::remove(dir);
}

TEST(JsonObjectReader, OnlyObjectsAreRead) {
  const Json arr = Json::parse("[1, 2]"), num = 3;
  EXPECT_EQ(error_of([&] { JsonObjectReader(arr, "", "r.json"); }),
            "r.json: top level: expected a JSON object, got [1,2]");
  EXPECT_EQ(error_of([&] { JsonObjectReader(num, "moe.experts", "r.json"); }),
            "r.json: moe.experts: expected a JSON object, got 3");
  // Long values are cut to 37 characters and "...".
  const Json long_array = Json::parse("[1111111111, 2222222222, 3333333333, 4444444444]");
  EXPECT_EQ(error_of([&] { JsonObjectReader(long_array, "", "r.json"); }),
            "r.json: top level: expected a JSON object, got [1111111111,2222222222,3333333333,444...");
}

TEST(JsonObjectReader, TypedGettersAndTheirErrors) {
  const Json j = Json::parse(R"({"n": 12, "neg": -3, "x": 2.5, "s": "text", "b": true, "f": 1.0, "q": "12",
                                 "big": [1111111111, 2222222222, 3333333333, 4444444444]})");
  const JsonObjectReader r(j, "", "r.json");
  EXPECT_EQ(r.get_int("n"), 12);
  EXPECT_EQ(r.get_int("neg"), -3);
  EXPECT_EQ(r.get_double("x"), 2.5);
  EXPECT_EQ(r.get_double("n"), 12.0);  // an integer is a number
  EXPECT_EQ(r.get_string("s"), "text");
  EXPECT_TRUE(r.get_bool("b", false));
  EXPECT_EQ(r.get("big").size(), 4u);

  EXPECT_EQ(error_of([&] { r.get_int("x"); }), "r.json: x: expected an integer, got 2.5");
  EXPECT_EQ(error_of([&] { r.get_int("f"); }), "r.json: f: expected an integer, got 1.0");
  EXPECT_EQ(error_of([&] { r.get_int("q"); }), "r.json: q: expected an integer, got \"12\"");
  EXPECT_EQ(error_of([&] { r.get_double("s"); }), "r.json: s: expected a number, got \"text\"");
  EXPECT_EQ(error_of([&] { r.get_double("b"); }), "r.json: b: expected a number, got true");
  EXPECT_EQ(error_of([&] { r.get_bool("n", true); }), "r.json: n: expected true or false, got 12");
  EXPECT_EQ(error_of([&] { r.get_string("n"); }), "r.json: n: expected a string, got 12");
  EXPECT_EQ(error_of([&] { r.get_string("big"); }),
            "r.json: big: expected a string, got [1111111111,2222222222,3333333333,444...");
  for (const auto& get : std::vector<std::function<void()>>{
           [&] { r.get_int("absent"); }, [&] { r.get_double("absent"); }, [&] { r.get_string("absent"); },
           [&] { r.get("absent"); }, [&] { r.object("absent"); }})
    EXPECT_EQ(error_of(get), "r.json: absent: required field is missing");
}

TEST(JsonObjectReader, FallbacksApplyOnlyWhenAbsent) {
  const Json j = Json::parse(R"({"n": 7, "x": 0.5, "s": "v", "b": false, "wrong": "str"})");
  const JsonObjectReader r(j, "", "r.json");
  EXPECT_EQ(r.get_int("n", 99), 7);
  EXPECT_EQ(r.get_int("none", 99), 99);
  EXPECT_EQ(r.get_double("x", 9.5), 0.5);
  EXPECT_EQ(r.get_double("none", 9.5), 9.5);
  EXPECT_EQ(r.get_string("s", "d"), "v");
  EXPECT_EQ(r.get_string("none", "d"), "d");
  EXPECT_FALSE(r.get_bool("b", true));
  EXPECT_TRUE(r.get_bool("none", true));
  EXPECT_TRUE(r.has("n"));
  EXPECT_FALSE(r.has("none"));
  // A present value of the wrong type is an error, never replaced by the fallback.
  EXPECT_EQ(error_of([&] { r.get_int("wrong", 1); }), "r.json: wrong: expected an integer, got \"str\"");
  EXPECT_EQ(error_of([&] { r.get_double("wrong", 1); }), "r.json: wrong: expected a number, got \"str\"");
  EXPECT_EQ(error_of([&] { r.get_bool("wrong", true); }), "r.json: wrong: expected true or false, got \"str\"");
  const Json null_value = Json::parse(R"({"k": null})");
  EXPECT_EQ(error_of([&] { JsonObjectReader(null_value, "", "r.json").get_string("k", "d"); }),
            "r.json: k: expected a string, got null");
}

TEST(JsonObjectReader, NestedObjectsCarryTheDottedPath) {
  const Json j = Json::parse(R"({"moe": {"experts": {"n": "eight"}, "list": [1]}})");
  const JsonObjectReader root(j, "", "r.json");
  const auto moe = root.object("moe");
  EXPECT_EQ(moe.field("k"), "r.json: moe.k");
  EXPECT_EQ(moe.source(), "r.json");
  const auto experts = moe.object("experts");
  EXPECT_EQ(error_of([&] { experts.get_int("n"); }), "r.json: moe.experts.n: expected an integer, got \"eight\"");
  EXPECT_EQ(error_of([&] { experts.get_int("k"); }), "r.json: moe.experts.k: required field is missing");
  EXPECT_EQ(error_of([&] { moe.object("list"); }), "r.json: moe.list: expected a JSON object, got [1]");
  EXPECT_EQ(error_of([&] { root.fail("depth", "must be positive"); }), "r.json: depth: must be positive");
  EXPECT_EQ(error_of([&] { experts.fail("n", "too many"); }), "r.json: moe.experts.n: too many");
}

TEST(JsonObjectReader, UnknownKeysAreRejectedWithTheClosestKnownKey) {
  const Json j = Json::parse(R"({"depth": 2, "seq_lne": 32, "vocab": 64})");
  {
    const JsonObjectReader r(j, "", "r.json");
    r.get_int("depth");
    r.get_int("seq_len", 128);  // asked for, absent: still a known key to suggest
    // Keys are checked in sorted order: seq_lne (distance 2 from seq_len) is the first one nobody read.
    EXPECT_EQ(error_of([&] { r.reject_unknown_keys(); }), "r.json: seq_lne: unknown key (did you mean 'seq_len'?)");
    // Extra known keys are accepted; vocab is 3 or more edits from every asked key: no suggestion.
    EXPECT_EQ(error_of([&] { r.reject_unknown_keys({"seq_lne"}); }), "r.json: vocab: unknown key");
    EXPECT_NO_THROW(r.reject_unknown_keys({"seq_lne", "vocab"}));
  }
  {
    // has() and get() count as reading; ties go to the first asked key in sorted order.
    const Json k = Json::parse(R"({"ab": 1, "c": 2, "d": 3})");
    const JsonObjectReader r(k, "", "r.json");
    EXPECT_TRUE(r.has("c"));
    r.get("d");
    r.has("ac");
    r.has("aa");
    EXPECT_EQ(error_of([&] { r.reject_unknown_keys(); }), "r.json: ab: unknown key (did you mean 'aa'?)");
  }
  {
    // A nested reader names the full path and only knows its own keys.
    const Json n = Json::parse(R"({"moe": {"experts": 4, "top_k": 2}})");
    const JsonObjectReader root(n, "", "r.json");
    const auto moe = root.object("moe");
    moe.get_int("experts");
    moe.get_int("topk", 1);
    EXPECT_NO_THROW(root.reject_unknown_keys());
    EXPECT_EQ(error_of([&] { moe.reject_unknown_keys(); }), "r.json: moe.top_k: unknown key (did you mean 'topk'?)");
  }
  const Json empty = Json::object();
  EXPECT_NO_THROW(JsonObjectReader(empty, "", "r.json").reject_unknown_keys());
}

}  // namespace
}  // namespace slm
