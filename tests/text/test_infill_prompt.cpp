// The infill prompt (text/infill_prompt.h) against layouts written out by hand with a byte-level encoder (one id
// per byte, so every count below can be checked by counting characters).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "slm/data/tokenizer.h"
#include "slm/text/infill_prompt.h"
#include "test_util.h"

namespace slm::test {
namespace {

using text::InfillOrder;
using Ids = std::vector<int64_t>;

constexpr int64_t BOS = 300, PRE = 301, SUF = 302, MID = 303, SEP = 304;

text::InfillTokens byte_tokens(bool with_separator = true) {
  text::InfillTokens t;
  t.bos = BOS;
  t.fim_prefix = PRE;
  t.fim_suffix = SUF;
  t.fim_middle = MID;
  t.file_sep = with_separator ? SEP : -1;
  return t;
}

Ids bytes(std::string_view s) {
  Ids out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

// The expected layout, piece by piece.
struct Layout {
  Ids ids;
  Layout& id(int64_t v) {
    ids.push_back(v);
    return *this;
  }
  Layout& text(std::string_view s) {
    for (unsigned char c : s) ids.push_back(c);
    return *this;
  }
};

text::InfillPrompt build(const text::InfillRequest& r, InfillOrder order, int64_t budget, bool sep = true) {
  return text::build_infill_prompt(r, order, budget, byte_tokens(sep), bytes);
}

text::InfillRequest request(std::string prefix, std::string prompt, std::string suffix) {
  text::InfillRequest r;
  r.prefix = std::move(prefix);
  r.prompt = std::move(prompt);
  r.suffix = std::move(suffix);
  return r;
}

TEST(InfillPrompt, BothOrdersWhenEverythingFits) {
  const auto r = request("ab\n", "c", "d\n");
  const auto psm = build(r, InfillOrder::Psm, 100);
  EXPECT_EQ(psm.ids, Layout().id(BOS).id(PRE).text("ab\nc").id(SUF).text("d\n").id(MID).ids);
  EXPECT_FALSE(psm.truncated);
  EXPECT_EQ(psm.context_end, 1);
  EXPECT_EQ(psm.prefix_tokens, 4);
  EXPECT_EQ(psm.suffix_tokens, 2);
  // SPM (variant 2 of the FIM paper): the prefix last, so the model continues it with the middle.
  const auto spm = build(r, InfillOrder::Spm, 100);
  EXPECT_EQ(spm.ids, Layout().id(BOS).id(PRE).id(SUF).text("d\n").id(MID).text("ab\nc").ids);
  EXPECT_FALSE(spm.truncated);
}

TEST(InfillPrompt, ExtraChunksComeFirstEachWithItsPathThenTheCurrentFile) {
  auto r = request("ab\n", "c", "d\n");
  r.extra = {{"a.h", "int a;\n"}, {"b.h", "B\n"}};
  r.filename = "m.cpp";
  const auto p = build(r, InfillOrder::Psm, 100);
  EXPECT_EQ(p.ids, Layout()
                       .id(BOS)
                       .id(SEP).text("a.h\nint a;\n")
                       .id(SEP).text("b.h\nB\n")
                       .id(SEP).text("m.cpp\n")
                       .id(PRE).text("ab\nc").id(SUF).text("d\n").id(MID)
                       .ids);
  EXPECT_EQ(p.context_end, 1 + 12 + 7 + 7);
  EXPECT_EQ(p.extra_kept, 2);
  EXPECT_EQ(p.extra_dropped, 0);
  EXPECT_FALSE(p.truncated);
  const auto s = build(r, InfillOrder::Spm, 100);
  EXPECT_EQ(s.ids, Layout()
                       .id(BOS)
                       .id(SEP).text("a.h\nint a;\n")
                       .id(SEP).text("b.h\nB\n")
                       .id(SEP).text("m.cpp\n")
                       .id(PRE).id(SUF).text("d\n").id(MID).text("ab\nc")
                       .ids);
}

TEST(InfillPrompt, OverLongPrefixAndSuffixLoseTheirFarEndsByWholeLines) {
  // 4 fixed tokens, 12 for the text: P is 10 bytes, S 6. S may keep 12 / 4 = 3 of them, P the other 9: P drops its
  // first line (7 left), S keeps its first line (3 of the 5 left to it).
  const auto r = request("l1\nl2\nl3\n", "x", "s1\ns2\n");
  const auto p = build(r, InfillOrder::Psm, 16);
  EXPECT_EQ(p.ids, Layout().id(BOS).id(PRE).text("l2\nl3\nx").id(SUF).text("s1\n").id(MID).ids);
  EXPECT_TRUE(p.truncated);
  EXPECT_EQ(p.prefix_tokens, 7);
  EXPECT_EQ(p.suffix_tokens, 3);
  const auto s = build(r, InfillOrder::Spm, 16);
  EXPECT_EQ(s.ids, Layout().id(BOS).id(PRE).id(SUF).text("s1\n").id(MID).text("l2\nl3\nx").ids);
}

TEST(InfillPrompt, ASideThatNeedsLessThanItsShareLeavesTheRestToTheOther) {
  // 20 tokens of room; the suffix needs 2 of its 5, so the prefix may take 18: three of its ten 5-byte lines and
  // the cursor's line (16).
  std::string prefix;
  for (int i = 0; i < 10; ++i) prefix += "aaaa\n";
  const auto p = build(request(prefix, "b", "}\n"), InfillOrder::Psm, 24);
  EXPECT_EQ(p.ids, Layout().id(BOS).id(PRE).text("aaaa\naaaa\naaaa\nb").id(SUF).text("}\n").id(MID).ids);
  // The other way round: a short prefix leaves the suffix all but its own 2 tokens.
  std::string suffix;
  for (int i = 0; i < 10; ++i) suffix += "zzzz\n";
  const auto q = build(request("", "y;", suffix), InfillOrder::Psm, 24);
  EXPECT_EQ(q.ids, Layout().id(BOS).id(PRE).text("y;").id(SUF).text("zzzz\nzzzz\nzzzz\n").id(MID).ids);
}

TEST(InfillPrompt, ALineLongerThanItsShareIsCutByTokensAtItsFarEnd) {
  const auto p = build(request("", "abcdefghij", ""), InfillOrder::Psm, 10);
  EXPECT_EQ(p.ids, Layout().id(BOS).id(PRE).text("efghij").id(SUF).id(MID).ids);
  EXPECT_TRUE(p.truncated);
  const auto s = build(request("", "", "0123456789\nrest\n"), InfillOrder::Psm, 10);
  EXPECT_EQ(s.ids, Layout().id(BOS).id(PRE).id(SUF).text("012345").id(MID).ids);
}

TEST(InfillPrompt, TheOldestExtraChunksGoFirstAndOnlyWhole) {
  auto r = request("p", "", "s");
  r.extra = {{"o.h", "old\n"}, {"n.h", "new\n"}};  // 9 tokens each with their separator
  // Fixed: 4 and the current file's header <|file_sep|> "\n" (2); p and s 2; room for one chunk: the newest.
  const auto one = build(r, InfillOrder::Psm, 6 + 2 + 9);
  EXPECT_EQ(one.ids,
            Layout().id(BOS).id(SEP).text("n.h\nnew\n").id(SEP).text("\n").id(PRE).text("p").id(SUF).text("s").id(MID).ids);
  EXPECT_EQ(one.context_end, 12);
  EXPECT_EQ(one.extra_kept, 1);
  EXPECT_EQ(one.extra_dropped, 1);
  EXPECT_TRUE(one.truncated);
  // One token short of the newest chunk: none is kept (never a cut one), and without a path the header goes too.
  const auto none = build(r, InfillOrder::Psm, 6 + 2 + 8);
  EXPECT_EQ(none.ids, Layout().id(BOS).id(PRE).text("p").id(SUF).text("s").id(MID).ids);
  EXPECT_EQ(none.extra_dropped, 2);
  EXPECT_TRUE(none.truncated);
  // The text around the cursor is kept before any chunk: a prefix that fills the budget leaves no room for them.
  auto crowded = request("0123456789", "", "");
  crowded.extra = r.extra;
  crowded.filename = "f";
  const auto c = build(crowded, InfillOrder::Psm, 4 + 3 + 10);
  EXPECT_EQ(c.ids, Layout().id(BOS).id(SEP).text("f\n").id(PRE).text("0123456789").id(SUF).id(MID).ids);
  EXPECT_EQ(c.extra_dropped, 2);
}

TEST(InfillPrompt, WithoutAFileSeparatorTheExtraChunksAreLeftOut) {
  auto r = request("p", "", "s");
  r.extra = {{"o.h", "old\n"}};
  r.filename = "m.cpp";
  const auto p = build(r, InfillOrder::Psm, 100, /*sep=*/false);
  EXPECT_EQ(p.ids, Layout().id(BOS).id(PRE).text("p").id(SUF).text("s").id(MID).ids);
  EXPECT_EQ(p.extra_dropped, 1);
  EXPECT_FALSE(p.truncated) << "nothing was left out for the budget";
}

TEST(InfillPrompt, ABudgetBelowTheFixedTokensGivesJustThem) {
  const auto p = build(request("abc", "", "d"), InfillOrder::Spm, 2);
  EXPECT_EQ(p.ids, Layout().id(BOS).id(PRE).id(SUF).id(MID).ids);
  EXPECT_TRUE(p.truncated);
}

TEST(InfillPrompt, WithTheCodeTokenizer) {
  const auto tok = data::Tokenizer::load(source_path("tokenizer/slm-code-512.model"));
  const auto t = text::infill_tokens(tok);
  // The committed models' former <|reserved_0|> (id 18) is the file separator (data/tokenizer.cpp).
  EXPECT_EQ(t.file_sep, 18);
  const auto p = text::build_infill_prompt(request("int main() {\n", "  return ", "\n}\n"), InfillOrder::Psm, 200, tok);
  ASSERT_GE(p.ids.size(), 4u);
  EXPECT_EQ(p.ids[0], tok.bos_id());
  EXPECT_EQ(p.ids[1], tok.special_id("<|fim_prefix|>"));
  EXPECT_EQ(p.ids.back(), tok.special_id("<|fim_middle|>"));
  std::vector<uint32_t> all(p.ids.begin(), p.ids.end());
  EXPECT_EQ(tok.decode(all, /*render_specials=*/true),
            "<|bos|><|fim_prefix|>int main() {\n  return <|fim_suffix|>\n}\n<|fim_middle|>");
  // With the separator the extra chunks are kept, each after <|file_sep|> and its path, then the current file's.
  auto r = request("int main() {\n", "  return ", "\n}\n");
  r.extra = {{"a.h", "int a();\n"}};
  r.filename = "m.cpp";
  const auto q = text::build_infill_prompt(r, InfillOrder::Spm, 200, tok);
  EXPECT_EQ(q.extra_kept, 1);
  std::vector<uint32_t> with_extra(q.ids.begin(), q.ids.end());
  EXPECT_EQ(std::count(with_extra.begin(), with_extra.end(), 18u), 2);
  EXPECT_EQ(tok.decode(with_extra, /*render_specials=*/true),
            "<|bos|><|file_sep|>a.h\nint a();\n<|file_sep|>m.cpp\n<|fim_prefix|><|fim_suffix|>\n}\n<|fim_middle|>int "
            "main() {\n  return ");
}

}  // namespace
}  // namespace slm::test
