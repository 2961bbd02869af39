// The code tokenizer: byte-exact round trips (committed model and a freshly trained tiny one), special tokens,
// and the encode/decode commands.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <random>

#include "data_test_util.h"
#include "slm/data/tokenizer.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

namespace {

const char* kModel = "tokenizer/slm-code-32k.model";

const Tokenizer& committed() {
  static const Tokenizer t = Tokenizer::load(source_path(kModel));
  return t;
}

std::vector<std::string> tricky_texts() {
  std::vector<std::string> v = {
      "",
      "int main() {\n    return 0;\n}\n",
      "\t\tx  =  y;\t// tabs and  runs   of    spaces     \n",
      "line one\r\nline two\r\n\r\n",
      "  leading and trailing  ",
      "\xff\xfe invalid \xc3 utf-8 \xe2\x82 \xed\xa0\x80 surrogate \xf4\x90\x80\x80 too big",
      std::string("nul\0bytes\0", 10),
      "the space marker \xe2\x96\x81 and \xe2\x96\x81\xe2\x96\x81 twice",
      "unicode: \xce\xbb \xe2\x86\x92 \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87",
      "literal specials: <|fim_prefix|> <|user|> <|bos|> <|file_sep|> <s> </s>",
      "digits 1234567890 3.14159e-10 0xDEADBEEF",
      std::string(300, ' ') + "\n" + std::string(50, '\t'),
      "#include <vector>\ntemplate <typename T>\nstd::vector<T> f(const std::vector<T>& v) { return v; }\n",
  };
  std::mt19937_64 rng(1);
  for (int k = 0; k < 20; ++k) {
    std::string s(1 + rng() % 300, '\0');
    for (auto& c : s) c = static_cast<char>(rng() & 0xff);
    v.push_back(s);
  }
  return v;
}

}  // namespace

TEST(Tokenizer, CommittedModelRoundTripsArbitraryBytes) {
  const auto& t = committed();
  EXPECT_GE(t.vocab_size(), 16384u);
  for (const auto& s : tricky_texts()) {
    auto ids = t.encode(s);
    for (auto id : ids) ASSERT_FALSE(t.is_special(id)) << "text never yields special tokens";
    ASSERT_EQ(t.decode(ids), s) << "round trip of " << ::testing::PrintToString(s);
  }
}

TEST(Tokenizer, CommittedModelCompressesCode) {
  const auto& t = committed();
  std::string code = read_file(source_path("src/slm/data/shards.cpp"));
  auto ids = t.encode(code);
  EXPECT_EQ(t.decode(ids), code);
  EXPECT_GT(static_cast<double>(code.size()) / ids.size(), 2.8) << "bytes/token on this repo's C++";
}

TEST(Tokenizer, SpecialTokensAreControlSymbols) {
  const auto& t = committed();
  EXPECT_EQ(t.pad_id(), 0u);
  EXPECT_EQ(t.bos_id(), 2u);
  EXPECT_EQ(t.eos_id(), 3u);
  ASSERT_EQ(tokenizer_control_symbols().size(), 22u);  // ids 4-25 (tokenizer/README.md)
  for (size_t i = 0; i < tokenizer_control_symbols().size(); ++i) {
    const std::string& name = tokenizer_control_symbols()[i];
    const uint32_t id = t.special_id(name);
    EXPECT_EQ(id, 4 + i) << name;
    EXPECT_TRUE(t.is_special(id));
    EXPECT_EQ(t.decode({id}), "");
    EXPECT_EQ(t.decode({id}, /*render_specials=*/true), name);
  }
  EXPECT_NE(error_of([&] { t.special_id("<|nope|>"); }).find("no special token"), std::string::npos);
  EXPECT_NE(error_of([&] { t.decode({t.vocab_size()}); }).find("outside the vocabulary"), std::string::npos);
}

TEST(Tokenizer, ShippedModelsHaveTheFileSeparatorAtTheirFormerReservedIds) {
  // The shipped models were trained with <|reserved_0|> and <|reserved_1|> at ids 18 and 19 (read from the .model
  // files' protobuf pieces with a separate wire-format reader: both are CONTROL pieces, after <|domain|> at 17).
  for (const char* path :
       {"tokenizer/slm-code-8k.model", "tokenizer/slm-code-32k.model", "tokenizer/slm-code-512.model"}) {
    SCOPED_TRACE(path);
    const auto t = Tokenizer::load(source_path(path));
    EXPECT_EQ(t.special_id("<|domain|>"), 17u);
    EXPECT_EQ(t.special_id("<|file_sep|>"), 18u);
    EXPECT_EQ(t.special_id("<|repo_name|>"), 19u);
    EXPECT_EQ(t.special_id("<|reserved_2|>"), 20u);
    EXPECT_EQ(t.piece(18), "<|file_sep|>");
    EXPECT_EQ(t.piece(19), "<|repo_name|>");
    // The old names are gone, so a renamed id has one name only.
    EXPECT_NE(error_of([&] { t.special_id("<|reserved_0|>"); }).find("no special token"), std::string::npos);
    EXPECT_NE(error_of([&] { t.special_id("<|reserved_1|>"); }).find("no special token"), std::string::npos);
    for (uint32_t id : {18u, 19u}) {
      EXPECT_TRUE(t.is_special(id));
      EXPECT_EQ(t.decode({id}), "");
    }
    // Text never yields them: the literal names encode as ordinary pieces and decode back to themselves.
    const std::string text = "a<|file_sep|>b\n<|repo_name|>c <|reserved_0|>";
    const auto ids = t.encode(text);
    for (uint32_t id : ids) EXPECT_FALSE(t.is_special(id)) << id;
    EXPECT_GT(ids.size(), 6u);
    EXPECT_EQ(t.decode(ids), text);
    // Rendered, the ids show their new names; a mixed sequence round-trips through its rendering.
    std::vector<uint32_t> mixed = {18};
    for (uint32_t id : t.encode("src/a.cc\nint a;\n")) mixed.push_back(id);
    mixed.push_back(19);
    EXPECT_EQ(t.decode(mixed, /*render_specials=*/true), "<|file_sep|>src/a.cc\nint a;\n<|repo_name|>");
    EXPECT_EQ(t.decode(mixed), "src/a.cc\nint a;\n");
  }
}

TEST(Tokenizer, TrainsATinyModelThatRoundTrips) {
  auto dir = fresh_dir("t");
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "for (int i = 0; i < n; ++i) {\n    sum += values[i] * " + std::to_string(i) + ";\n}\n";
  write_file(dir + "/in/a.cpp", text);
  write_file(dir + "/in/b.sh", "#!/bin/sh\nset -eu\nfor f in *.txt; do\n\techo \"$f\"\ndone\n");
  TokenizerTrainOptions o;
  o.inputs = {dir + "/in"};
  o.output = dir + "/tiny.model";
  o.vocab_size = 400;
  auto rep = train_tokenizer(o);
  EXPECT_EQ(rep.documents, 2u);
  EXPECT_EQ(rep.vocab_size, 400u);
  auto t = Tokenizer::load(o.output);
  for (const auto& s : tricky_texts()) ASSERT_EQ(t.decode(t.encode(s)), s);
  // A new model has the new names at the ids the shipped ones give them.
  EXPECT_EQ(t.special_id("<|file_sep|>"), 18u);
  EXPECT_EQ(t.special_id("<|repo_name|>"), 19u);
  EXPECT_EQ(t.special_id("<|reserved_7|>"), 25u);
  EXPECT_LT(t.encode(text).size(), text.size() / 3 * 2);  // merges beat raw bytes
}

TEST(Tokenizer, SplitSentencesCutsAtLineEnds) {
  auto parts = split_sentences("aaaa\nbbbb\ncccccccccccc\n", 10);
  std::string joined;
  for (const auto& p : parts) {
    EXPECT_LE(p.size(), 10u);
    joined += p;
  }
  EXPECT_EQ(joined, "aaaa\nbbbb\ncccccccccccc\n");
  EXPECT_EQ(parts[0], "aaaa\nbbbb\n");
}

TEST(TokenizerCli, EncodeDecodeRoundTripsFileBytes) {
  auto dir = fresh_dir("c");
  std::string bytes = "a\tb  c\r\n\xff\xe2\x96\x81 end";
  write_file(dir + "/in.bin", bytes);
  const std::string model = source_path(kModel);
  auto enc = run_slm("tokenizer encode --model " + model + " " + dir + "/in.bin");
  ASSERT_EQ(enc.code, 0) << enc.out;
  write_file(dir + "/ids.txt", enc.out);
  auto dec = run_slm("tokenizer decode --model " + model + " " + dir + "/ids.txt");
  ASSERT_EQ(dec.code, 0) << dec.out;
  EXPECT_EQ(dec.out, bytes);
  auto bad = run_slm("tokenizer decode --model " + model + " " + dir + "/in.bin");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("is not a token id"), std::string::npos) << bad.out;
}
