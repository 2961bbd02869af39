// Context-graph documents from a built corpus: one call graph per package and split, documents in that split's
// shards of the cpp-graphs domain, with the package, path and license of their target.
#include <set>

#include "data_test_util.h"
#include "slm/data/corpus_graphs.h"
#include "slm/data/shards.h"
#include "slm/data/tokenizer.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

namespace {

std::string record(const std::string& package, const std::string& path, const std::string& license,
                   const std::string& text) {
  return nlohmann::json{{"package", package}, {"path", path}, {"license", license}, {"domain", "cpp"}, {"text", text}}
             .dump() +
         "\n";
}

}  // namespace

TEST(CorpusGraphs, OneGraphPerPackageAndSplitWithTheTargetsProvenance) {
  const std::string dir = fresh_dir("cg"), corpus = dir + "/corpus", shards = dir + "/shards";
  // Package alpha (train): helper <- user <- other across two files: three functions with edges.
  // Package beta (test): f -> g, and lonely() with no edge (skipped).
  write_file(corpus + "/cpp/train.jsonl",
             record("alpha", "/src/alpha_1.0/a.cpp", "MIT",
                    "int helper(int x) { return x + 1; }\nint user(int y) { return helper(y) * 2; }\n") +
                 record("alpha", "/src/alpha_1.0/b.cpp", "BSD-3-clause", "int other(int z) { return user(z) - 3; }\n"));
  write_file(corpus + "/cpp/test.jsonl",
             record("beta", "/src/beta_2.0/m.cpp", "GPL-2+",
                    "int g() { return 41; }\nint f() { return g() + 1; }\nvoid lonely() {}\n"));
  write_file(corpus + "/report.json", R"({"domains": [{"domain": "cpp", "tokens": 1000}]})");
  CorpusGraphOptions o;
  o.corpus_dir = corpus;
  o.shards_dir = shards;
  o.tokenizer = source_path("tokenizer/slm-code-32k.model");
  o.docs.budget = 512;
  const auto r = build_corpus_graphs(o);
  EXPECT_EQ(r.packages, 2u);
  EXPECT_EQ(r.files, 3u);
  EXPECT_EQ(r.functions, 6u);
  EXPECT_EQ(r.docs.documents, 5u);
  EXPECT_EQ(r.docs.isolated, 1u);
  EXPECT_EQ(r.split_documents.at("train"), 3u);
  EXPECT_EQ(r.split_documents.at("test"), 2u);
  EXPECT_EQ(r.whole_file_tokens, 1000u);

  const auto tok = Tokenizer::load(o.tokenizer);
  const auto train = Shard::open(shards + "/cpp-graphs/train-00000.slmtok");
  const auto metas = train->metadata();
  ASSERT_EQ(metas.size(), 3u);
  std::set<std::string> targets;
  for (size_t d = 0; d < metas.size(); ++d) {
    EXPECT_EQ(metas[d].package, "alpha");
    EXPECT_EQ(metas[d].domain, "cpp-graphs");
    EXPECT_EQ(metas[d].license, metas[d].path.ends_with("b.cpp") ? "BSD-3-clause" : "MIT") << metas[d].path;
    const std::string text = tok.decode(train->document(d), /*render_specials=*/true);
    EXPECT_TRUE(text.starts_with("<|bos|><|callers|>")) << text;
    targets.insert(text.substr(text.find("<|target|>")));
  }
  // user's document holds its caller (other) before the target and its callee (helper) after.
  bool found_user = false;
  for (size_t d = 0; d < metas.size(); ++d) {
    const std::string text = tok.decode(train->document(d), true);
    const size_t target = text.find("<|target|>"), callees = text.find("<|callees|>");
    if (text.find("int user(int y)", target) < callees) {
      found_user = true;
      EXPECT_LT(text.find("int other(int z)"), target) << text;
      EXPECT_GT(text.find("int helper(int x)"), callees) << text;
    }
  }
  EXPECT_TRUE(found_user);
  const auto test = Shard::open(shards + "/cpp-graphs/test-00000.slmtok");
  for (const auto& m : test->metadata()) EXPECT_EQ(m.package, "beta");
  EXPECT_NE(::access((shards + "/cpp-graphs/validation-00000.slmtok").c_str(), F_OK), 0);  // no such input split

  EXPECT_NE(error_of([&] {
              CorpusGraphOptions bad = o;
              bad.corpus_dir = dir + "/nothing";
              build_corpus_graphs(bad);
            }).find("no {train,validation,test}.jsonl"),
            std::string::npos);
}
