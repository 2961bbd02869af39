// The fast BPE encoder against sentencepiece's own encoder, id for id, on both committed models: the repo's own
// sources and documents, random bytes, random valid UTF-8, random concatenations of vocabulary pieces and
// adversarial runs (whitespace, digits, long identifiers); a tiny chunk table that is cleared many times; and a
// model the fast encoder must refuse (then Tokenizer falls back to sentencepiece).
#include <sentencepiece_processor.h>

#include <filesystem>
#include <random>
#include <thread>

#include "data_test_util.h"
#include "slm/data/bpe_encoder.h"
#include "slm/data/text.h"
#include "slm/data/tokenizer.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

namespace {

const char* kModels[] = {"tokenizer/slm-code-32k.model", "tokenizer/slm-code-512.model"};
const std::string kMarker = "\xe2\x96\x81";

struct Model {
  std::string bytes;
  Tokenizer tok;
  sentencepiece::SentencePieceProcessor sp;  // the reference, loaded independently of Tokenizer
  Model(std::string model_bytes, const std::string& name)
      : bytes(std::move(model_bytes)), tok(Tokenizer::from_serialized(bytes, name)) {
    EXPECT_TRUE(sp.LoadFromSerializedProto(bytes).ok()) << name;
  }
  std::vector<uint32_t> reference(const std::string& text) const {
    std::vector<int> ids;
    EXPECT_TRUE(sp.Encode(text, &ids).ok());
    return {ids.begin(), ids.end()};
  }
};

const Model& model(int i) {
  static const Model m0(read_file(source_path(kModels[0])), kModels[0]);
  static const Model m1(read_file(source_path(kModels[1])), kModels[1]);
  return i == 0 ? m0 : m1;
}

// Text sentencepiece itself keeps intact: valid UTF-8 without NUL and without U+2581.
bool sp_safe(const std::string& s) {
  return is_clean_text(s) && s.find(kMarker) == std::string::npos;
}

// Checks Tokenizer::encode on text: equal to sentencepiece on the whole text when sentencepiece keeps it intact,
// equal to Tokenizer::encode_sentencepiece always, and decodes back to text.
void expect_exact(const Model& m, const std::string& text, const std::string& what) {
  const auto ids = m.tok.encode(text);
  if (sp_safe(text)) {
    ASSERT_EQ(ids, m.reference(text)) << what << ": " << ::testing::PrintToString(text.substr(0, 200));
  }
  ASSERT_EQ(ids, m.tok.encode_sentencepiece(text)) << what;
  ASSERT_EQ(m.tok.decode(ids), text) << what;
}

std::vector<std::pair<std::string, std::string>> repo_texts() {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* dir : {"src/slm/data", "apps/slm", "tests/data", "docs", "recipes", "scripts", "tokenizer"}) {
    for (const auto& e : fs::recursive_directory_iterator(source_path(dir))) {
      if (!e.is_regular_file() || e.path().extension() == ".model") continue;
      out.emplace_back(e.path().string(), read_file(e.path().string()));
    }
  }
  for (const char* f : {"README.md", "CMakeLists.txt"}) out.emplace_back(f, read_file(source_path(f)));
  return out;
}

class FastEncoder : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(FastEncoder, IsUsedForTheCommittedModels) {
  std::string why;
  EXPECT_NE(BpeEncoder::create(model(GetParam()).bytes, &why), nullptr) << why;
}

TEST_P(FastEncoder, EqualsSentencePieceOnTheRepoSourcesAndDocuments) {
  const auto& m = model(GetParam());
  size_t bytes = 0, files = 0;
  for (const auto& [path, text] : repo_texts()) {
    expect_exact(m, text, path);
    bytes += text.size(), ++files;
  }
  EXPECT_GT(files, 50u);
  EXPECT_GT(bytes, 500'000u);
}

TEST_P(FastEncoder, EqualsSentencePieceOnRandomBytesAndRandomUtf8) {
  const auto& m = model(GetParam());
  std::mt19937_64 rng(7 + GetParam());
  for (int k = 0; k < 300; ++k) {
    std::string s(rng() % 400, '\0');
    for (auto& c : s) c = static_cast<char>(rng() & 0xff);
    expect_exact(m, s, "random bytes");
  }
  // Valid UTF-8 drawn from characters that sit at chunk boundaries: spaces, tabs, line ends, digits, punctuation,
  // letters, multi-byte characters (some in the vocabulary, some only as bytes).
  // clang-format off
  const std::vector<std::string> alphabet = {
      " ", "  ", "\t", "\n", "\r\n", "0", "7", "a", "Z", "_", "x", "(", ")", "{", "}", ";", "/", "*", "#", "<", ">",
      ":", ".", "\"", "'", "\x7f", "\x01",
      "\xc3\xa9", "\xce\xbb", "\xe2\x86\x92", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xe2\x96\x80", "\xe2\x96\x82",
      "\xef\xbb\xbf", "\xef\xbf\xbe", "\xee\x80\x80", "\xf4\x8f\xbf\xbf"};  // BOM, U+FFFE, U+E000, U+10FFFF
  // clang-format on
  for (int k = 0; k < 300; ++k) {
    std::string s;
    for (size_t n = rng() % 200; n > 0; --n) s += alphabet[rng() % alphabet.size()];
    ASSERT_TRUE(is_valid_utf8(s));
    expect_exact(m, s, "random utf-8");
  }
}

TEST_P(FastEncoder, EqualsSentencePieceOnConcatenatedVocabularyPieces) {
  // Pieces glued together produce every kind of merge that can cross a chunk boundary in the vocabulary.
  const auto& m = model(GetParam());
  std::vector<std::string> pieces;
  for (uint32_t id = 0; id < m.tok.vocab_size(); ++id)
    if (!m.tok.is_special(id) && m.tok.decode({id}).size() > 0 && is_valid_utf8(m.tok.decode({id})))
      pieces.push_back(m.tok.decode({id}));
  std::mt19937_64 rng(11 + GetParam());
  for (int k = 0; k < 300; ++k) {
    std::string s;
    for (size_t n = 1 + rng() % 40; n > 0; --n) s += pieces[rng() % pieces.size()];
    if (!is_valid_utf8(s)) continue;  // byte pieces may glue into something else
    expect_exact(m, s, "pieces");
  }
}

TEST_P(FastEncoder, EqualsSentencePieceOnAdversarialRuns) {
  const auto& m = model(GetParam());
  std::vector<std::string> texts;
  for (size_t n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 100, 1000, 10000}) {
    texts.push_back(std::string(n, ' '));
    texts.push_back(std::string("x").append(n, ' ').append("y"));
    texts.push_back(std::string(n, '\t') + "int");
    texts.push_back(std::string(n, '\n'));
    texts.push_back(std::string(n, '/'));
    texts.push_back(std::string(n, '9'));
    texts.push_back(std::string("\n").append(n, ' ').append("return x;\n"));
  }
  std::string digits, ident, mixed, tabs;
  for (int i = 0; i < 3000; ++i) digits += std::to_string(i);
  for (int i = 0; i < 20000; ++i) ident += static_cast<char>("abcdefghij_ABC"[i * 7 % 14]);
  for (int i = 0; i < 2000; ++i) mixed += std::string(i % 9, ' ') + (i % 3 ? "\t" : "\n") + (i % 5 ? "" : "\r");
  for (int i = 0; i < 500; ++i) tabs += "\t \t  \n\n  \t" + std::to_string(i % 10) + "a\xce\xbb ";
  texts.insert(texts.end(), {digits, ident, mixed, tabs, "a" + ident + " " + ident + "1"});
  for (const auto& t : texts) expect_exact(m, t, "adversarial");
}

TEST_P(FastEncoder, ATinyChunkTableClearedManyTimesChangesNothing) {
  const auto& m = model(GetParam());
  auto enc = BpeEncoder::create(m.bytes, nullptr, /*max_cached_chunks=*/16);
  ASSERT_NE(enc, nullptr);
  const std::string code = read_file(source_path("src/slm/data/tokenizer.cpp"));
  for (int pass = 0; pass < 2; ++pass) {  // the second pass finds chunks in the table
    std::vector<uint32_t> ids;
    enc->encode(code, ids);
    ASSERT_EQ(ids, m.reference(code)) << "pass " << pass;
  }
}

TEST_P(FastEncoder, ThreadsSharingTheChunkTableGetTheSameIds) {
  // One thread holds the table at a time; the others encode without it.
  const auto& m = model(GetParam());
  const std::string code = read_file(source_path("src/slm/data/corpus.cpp"));
  const auto want = m.reference(code);
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 3; ++k) wrong[t] += m.tok.encode(code) != want;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

INSTANTIATE_TEST_SUITE_P(Models, FastEncoder, ::testing::Values(0, 1),
                         [](const auto& info) { return info.param == 0 ? "Code32k" : "Code512"; });

TEST(FastEncoderTrained, MergesOfMultiByteCharactersAndASpaceOutsideTheVocabulary) {
  // The committed models have no multi-character piece with a non-ASCII character, and both know the space.
  // A model trained on Greek, CJK and arrows separated by tabs and newlines only has both of those cases.
  auto dir = fresh_dir("t");
  const std::vector<std::string> words = {
      "\xce\xbb\xce\xb1",         "\xce\xbb\xce\xb1\xce\xbc",     "\xe4\xb8\xad\xe6\x96\x87",
      "\xe2\x86\x92\xe2\x86\x92", "\xce\xb1\xe2\x86\x92\xce\xb2", "x\xce\xbb"};
  std::mt19937_64 rng(3);
  std::string text;
  for (int i = 0; i < 4000; ++i) text += words[rng() % words.size()] + (i % 7 ? "\t" : "\n");
  write_file(dir + "/in/a.txt", text);
  TokenizerTrainOptions o;
  o.inputs = {dir + "/in"};
  o.output = dir + "/m.model";
  o.vocab_size = 300;
  train_tokenizer(o);
  const Model m(read_file(o.output), o.output);
  ASSERT_NE(BpeEncoder::create(m.bytes, nullptr), nullptr);
  bool multibyte_merge = false;
  for (uint32_t id = 0; id < m.tok.vocab_size(); ++id) {
    const std::string p = m.tok.decode({id});
    multibyte_merge |= p.size() > 2 && static_cast<unsigned char>(p[0]) >= 0x80 && !m.tok.is_special(id);
  }
  EXPECT_TRUE(multibyte_merge) << "the model should merge multi-byte characters";
  EXPECT_EQ(m.sp.PieceToId(kMarker), m.sp.unk_id()) << "the model should not know the space";
  for (int k = 0; k < 200; ++k) {
    std::string s;
    for (size_t n = rng() % 30; n > 0; --n) s += words[rng() % words.size()] + std::string(" \t\n" + rng() % 3, 1);
    ASSERT_EQ(m.tok.encode(s), m.reference(s)) << s;
  }
}

TEST(FastEncoderRefusal, AModelWithADummyPrefixFallsBackToSentencePiece) {
  // Appending a NormalizerSpec field merges into the model's (protobuf semantics): add_dummy_prefix = true.
  std::string bytes = read_file(source_path(kModels[1]));
  bytes += std::string("\x1a\x02\x18\x01", 4);
  std::string why;
  EXPECT_EQ(BpeEncoder::create(bytes, &why), nullptr);
  EXPECT_NE(why.find("dummy prefix"), std::string::npos) << why;
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.LoadFromSerializedProto(bytes).ok());
  const auto tok = Tokenizer::from_serialized(bytes);
  for (const std::string text : {"int main() {\n  return 0;\n}\n", "a  b", "  lead"}) {
    std::vector<int> ref;
    ASSERT_TRUE(sp.Encode(text, &ref).ok());
    EXPECT_EQ(tok.encode(text), std::vector<uint32_t>(ref.begin(), ref.end())) << text;
    EXPECT_NE(tok.encode(text), model(1).tok.encode(text)) << "the dummy prefix is in effect: " << text;
  }
}
