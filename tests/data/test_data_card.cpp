// slm data card: a planted corpus whose sizes, package and license shares, removal counts and example are known by
// construction; the Markdown carries them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "slm/data/data_card.h"
#include "slm/util/error.h"

namespace slm::test {
namespace {

std::string record(const std::string& package, const std::string& path, const std::string& license,
                   const std::string& text) {
  return nlohmann::json{{"package", package}, {"path", path}, {"license", license}, {"domain", "x"}, {"text", text}}
             .dump() +
         "\n";
}

TEST(DataCard, SizesSharesRemovalsAndTheHeldOutExample) {
  const std::string dir = fresh_dir("c");
  // cmake: 3 train documents (a: 600 bytes MIT, b: 300 bytes GPL-2+, b: 100 bytes MIT), 1 validation (c: 200, MIT).
  const std::string a(599, 'a'), b1(299, 'b'), b2(99, 'b');
  write_file(dir + "/cmake/train.jsonl", record("a", "A.txt", "MIT", a + "\n") +
                                             record("b", "B.txt", "GPL-2+", b1 + "\n") +
                                             record("b", "C.txt", "MIT", b2 + "\n"));
  // A license header in comments first: the example starts after it.
  const std::string held =
      "# Copyright\n\n# SPDX: MIT\ncmake_minimum_required(VERSION 3.20)\nproject(p)\nadd_library(p p.cc)\n" +
      std::string(106, '#') + "\n";
  ASSERT_EQ(held.size(), 200u);
  write_file(dir + "/cmake/validation.jsonl", record("c", "CMakeLists.txt", "MIT", held));
  write_file(dir + "/cmake/test.jsonl", "");
  // design: only train, its example holds a Markdown fence.
  write_file(dir + "/design/train.jsonl", record("d", "README.md", "BSD-3-clause", "# T\n```sh\nmake\n```\nend\n"));
  write_file(dir + "/report.json", nlohmann::json{{"domains",
                                                   {{{"domain", "design"}, {"exact_duplicates", 4}, {"tokens", 9}},
                                                    {{"domain", "cmake"},
                                                     {"exact_duplicates", 2},
                                                     {"near_duplicates", 3},
                                                     {"cross_domain_duplicates", 1},
                                                     {"contaminated", 5},
                                                     {"candidates", 20},
                                                     {"tokens", 77}}}}}
                                       .dump());
  data::DataCardOptions o;
  o.corpus_dir = dir;
  o.top = 2;
  o.example_lines = 2;
  const auto cards = data::data_cards(o);
  ASSERT_EQ(cards.size(), 2u);
  EXPECT_EQ(cards[0].domain, "design");  // report.json's order
  const auto& c = cards[1];
  EXPECT_EQ(c.documents, 4u);
  EXPECT_EQ(c.bytes, 1200u);
  EXPECT_EQ(c.split_documents.at("train"), 3u);
  EXPECT_EQ(c.split_bytes.at("validation"), 200u);
  EXPECT_EQ(c.packages, 3u);
  EXPECT_EQ(c.licenses, 2u);
  using P = std::vector<std::pair<std::string, uint64_t>>;
  EXPECT_EQ(c.top_packages, (P{{"a", 600}, {"b", 400}, {"(1 others)", 200}}));
  EXPECT_EQ(c.top_licenses, (P{{"MIT", 900}, {"GPL-2+", 300}}));
  EXPECT_EQ(c.example, "cmake_minimum_required(VERSION 3.20)\nproject(p)");  // two lines of the validation document
  EXPECT_EQ(c.example_from, "validation: c, CMakeLists.txt (MIT)");
  const std::string md = data::data_cards_markdown(cards);
  EXPECT_NE(md.find("4 documents, 0.0 MB, 77 tokens; train / validation / test: 3 / 1 / 0"), std::string::npos) << md;
  EXPECT_NE(md.find("a 50.0%, b 33.3%, (1 others) 16.7%"), std::string::npos) << md;
  EXPECT_NE(md.find("MIT 75.0%, GPL-2+ 25.0%"), std::string::npos) << md;
  EXPECT_NE(md.find("2 exact and 3 near duplicates (1 of another domain's document), 5 contaminated"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("````text\n# T\n```sh"), std::string::npos) << md;  // a longer fence around one in the text
}

TEST(DataCard, ACorpusWithoutDomainsIsAnError) {
  data::DataCardOptions o;
  o.corpus_dir = fresh_dir("empty");
  EXPECT_THROW(data::data_cards(o), Error);
  o.corpus_dir += "/missing";
  EXPECT_THROW(data::data_cards(o), Error);
}

}  // namespace
}  // namespace slm::test
