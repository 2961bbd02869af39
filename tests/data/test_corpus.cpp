// Corpus building on a planted source tree: dedup (exact, near, cross-domain), decontamination, the
// split-by-file invariant, metadata; and text -> shards -> loader -> detokenize.
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "data_test_util.h"
#include "slm/data/corpus.h"
#include "slm/data/decontam.h"
#include "slm/data/dedup.h"
#include "slm/data/loader.h"
#include "slm/data/shard_builder.h"
#include "slm/data/text.h"
#include "slm/data/tokenizer.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;
namespace fs = std::filesystem;

namespace {

const char* kProblem =
    R"({"name": "HumanEval_99_planted", "prompt": "#include<assert.h>\n#include<bits/stdc++.h>\n// Return the sum of the squares of the odd numbers in the vector,\n// ignoring negative numbers.\n// >>> odd_square_sum((std::vector<long>({(long)1, (long)3})))\n// (10)\nlong odd_square_sum(std::vector<long> lst) {\n", "tests": "}\nint main() {\n    auto candidate = odd_square_sum;\n    assert(candidate((std::vector<long>({(long)1, (long)3}))) == (10));\n}\n", "stop_tokens": ["\n}"]})";

}  // namespace

TEST(Dedup, FindsExactAndNearDuplicatesAndKeepsDistinctFiles) {
  const std::string a = random_code(1);
  std::string near = a;
  near.replace(near.find("return"), 6, "return -");  // a one-token edit
  near += "int extra(int x) { return x; }\n";
  std::string reindented;
  for (char c : a) reindented += c == ' ' ? std::string("  ") : std::string(1, c);
  // Shared license header, different bodies: not duplicates.
  std::string header;
  for (int i = 0; i < 8; ++i) {
    header += "// Licensed under the Apache License, Version 2.0 (the \"License\"); line ";
    header += std::to_string(i);
    header += '\n';
  }
  Deduplicator d;
  EXPECT_EQ(d.offer(0, a).verdict, Deduplicator::Verdict::kUnique);
  EXPECT_EQ(d.offer(1, a).verdict, Deduplicator::Verdict::kExact);
  auto r = d.offer(2, near);
  EXPECT_EQ(r.verdict, Deduplicator::Verdict::kNear);
  EXPECT_EQ(r.duplicate_of, 0);
  EXPECT_EQ(d.offer(3, reindented).verdict, Deduplicator::Verdict::kNear);  // whitespace-insensitive shingles
  EXPECT_EQ(d.offer(4, header + random_code(2)).verdict, Deduplicator::Verdict::kUnique);
  EXPECT_EQ(d.offer(5, header + random_code(3)).verdict, Deduplicator::Verdict::kUnique);
  EXPECT_EQ(d.kept(), 3u);
}

TEST(Decontaminator, FindsAPlantedProblemNotOrdinaryCode) {
  std::vector<EvalProblem> problems = {{"p",
                                        "#include<bits/stdc++.h>\nusing namespace std;\n"
                                        "// Return the number of vowels in the string s, counting y at the end.\n"
                                        "long vowels_count(std::string s) {\n"}};
  Decontaminator dc(problems);
  auto hit = dc.check(random_code(5) + "// Return the number of vowels in the string s, counting y at the end.\n" +
                      random_code(6));
  EXPECT_TRUE(hit.contaminated);
  EXPECT_EQ(hit.problem, "p");
  // Includes and `using namespace std;` are shared with every program: never a match on their own.
  EXPECT_FALSE(dc.check("#include<bits/stdc++.h>\nusing namespace std;\nint main() { return 0; }\n").contaminated);
  EXPECT_FALSE(dc.check(random_code(7)).contaminated);
}

TEST(Decontaminator, LoadsTheRealEvaluationSet) {
  const std::string path = source_path("../shared/eval/multipl-e/humaneval-cpp.jsonl");
  if (!fs::exists(path)) GTEST_SKIP() << path << " not present";
  auto problems = load_eval_problems(path);
  EXPECT_EQ(problems.size(), 161u);
  Decontaminator dc(problems);
  // Every problem's own text is caught; this repository's C++ is not.
  for (const auto& p : problems) ASSERT_TRUE(dc.check(p.text).contaminated) << p.name;
  EXPECT_FALSE(dc.check(read_file(source_path("src/slm/data/corpus.cpp"))).contaminated);
}

TEST(Corpus, SplitIsByFileAndDeterministic) {
  std::map<std::string, int> count;
  for (int i = 0; i < 2000; ++i) {
    const std::string path = "/src/file" + std::to_string(i) + ".cpp";
    auto s = split_of("pkg", path, 0.1, 0.1, 0);
    EXPECT_EQ(s, split_of("pkg", path, 0.1, 0.1, 0));
    ++count[s];
  }
  EXPECT_NEAR(count["test"], 200, 60);
  EXPECT_NEAR(count["validation"], 200, 60);
}

class PlantedCorpus : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fresh_dir("c");
    src = dir + "/src";
    // cpp: distinct files, an exact copy, a near copy, a contaminated file, a binary file.
    for (int i = 0; i < 60; ++i) write_file(src + "/cpp/lib/f" + std::to_string(i) + ".cpp", random_code(100 + i));
    write_file(src + "/cpp/copy/exact.cpp", random_code(100));
    std::string near = random_code(101);
    near.replace(near.find("return"), 6, "return 1 +");
    write_file(src + "/cpp/copy/near.hpp", near);
    nlohmann::json p = nlohmann::json::parse(kProblem);
    write_file(src + "/cpp/leak/solution.cpp",
               random_code(7) + p["prompt"].get<std::string>() +
                   "  long s = 0;\n  for (long x : lst) if (x > 0 && x % 2) s += x * x;\n"
                   "  return s;\n" +
                   p["tests"].get<std::string>());
    write_file(src + "/cpp/lib/binary.cpp", std::string("\x7f"
                                                        "ELF\0\0\x01",
                                                        7) +
                                                random_code(9));
    write_file(src + "/cpp/lib/notes.txt", "not C++");
    // cmake and shell, with a cross-domain copy of a cpp file.
    write_file(src + "/cmake/CMakeLists.txt",
               "cmake_minimum_required(VERSION 3.25)\nproject(x CXX)\nadd_executable(x main.cpp)\n");
    write_file(src + "/cmake/FindFoo.cmake", "find_path(FOO_INCLUDE_DIR foo.h)\nfind_library(FOO_LIBRARY foo)\n");
    write_file(src + "/shell/run", "#!/bin/bash\nset -euo pipefail\nfor f in \"$@\"; do echo \"$f\"; done\n");
    write_file(src + "/shell/not-a-script", "plain text without a shebang, long enough to count\n");
    write_file(src + "/shell/copied.sh", random_code(105));
    write_file(dir + "/eval.jsonl", std::string(kProblem) + "\n");
    write_file(dir + "/doc/libfoo/copyright",
               "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
               "Files: *\nCopyright: 2020 Foo\nLicense: BSD-3-Clause\n");
    fs::create_directories(dir + "/dpkg");
    o.domains = {"cpp", "cmake", "shell"};
    o.out_dir = dir + "/out";
    o.roots["cpp"] = {{src + "/cpp", "libfoo", "", false, {}, ""}};
    o.roots["cmake"] = {{src + "/cmake", "cmake-data", "BSD-3-Clause", false, {}, ""}};
    o.roots["shell"] = {{src + "/shell", "scripts", "GPL-2+", false, {}, ""}};
    o.validation_fraction = 0.2;
    o.test_fraction = 0.2;
    o.eval_jsonl = dir + "/eval.jsonl";
    o.dpkg_info_dir = dir + "/dpkg";
    o.doc_dir = dir + "/doc";
  }
  std::string dir, src;
  CorpusOptions o;
};

TEST_F(PlantedCorpus, DedupDecontaminatesSplitsAndRecordsMetadata) {
  auto rep = build_corpus(o);
  ASSERT_EQ(rep.domains.size(), 3u);
  const auto& cpp = rep.domains[0];
  EXPECT_EQ(cpp.exact_dups, 1u);
  EXPECT_EQ(cpp.near_dups, 1u);
  EXPECT_EQ(cpp.contaminated, 1u);
  EXPECT_EQ(cpp.dropped_unclean, 1u);
  EXPECT_EQ(cpp.documents, 60u);
  EXPECT_EQ(rep.domains[1].documents, 2u);
  EXPECT_EQ(rep.domains[2].documents, 1u);  // the copy of a cpp file is a cross-domain duplicate
  EXPECT_EQ(rep.domains[2].exact_dups, 1u);
  EXPECT_EQ(rep.domains[2].cross_domain_dups, 1u);

  std::map<std::string, std::set<std::string>> split_of_path;
  std::set<std::string> texts;
  for (const auto& d : o.domains)
    for (const char* s : {"train", "validation", "test"})
      for (const auto& j : read_jsonl(o.out_dir + "/" + d + "/" + s + ".jsonl")) {
        split_of_path[j["path"]].insert(s);
        EXPECT_EQ(j["domain"], d);
        EXPECT_FALSE(j["package"].get<std::string>().empty());
        EXPECT_FALSE(j["license"].get<std::string>().empty());
        EXPECT_TRUE(texts.insert(j["text"].get<std::string>()).second) << "duplicate text kept: " << j["path"];
        EXPECT_EQ(j["text"].get<std::string>().find("odd_square_sum"), std::string::npos) << "contaminated text kept";
      }
  EXPECT_EQ(split_of_path.size(), 63u);
  std::set<std::string> used;
  for (const auto& [path, splits] : split_of_path) {
    EXPECT_EQ(splits.size(), 1u) << path << " is in two splits";
    used.insert(*splits.begin());
  }
  EXPECT_EQ(used.size(), 3u);  // 60 files at 20/20%: every split is used
  // Licenses: the package's Debian copyright file (cpp), or the root's (cmake).
  auto cpp_train = read_jsonl(o.out_dir + "/cpp/train.jsonl");
  ASSERT_FALSE(cpp_train.empty());
  EXPECT_EQ(cpp_train[0]["license"], "BSD-3-Clause");
  EXPECT_EQ(cpp_train[0]["package"], "libfoo");

  // The report names every removed document with its reason.
  auto report = nlohmann::json::parse(read_file(o.out_dir + "/report.json"));
  std::set<std::string> reasons;
  for (const auto& r : report["removed"]) reasons.insert(r["reason"]);
  EXPECT_EQ(reasons, (std::set<std::string>{"exact-duplicate", "near-duplicate", "contaminated"}));
  EXPECT_NE(rep.table().find("| cpp | 60 |"), std::string::npos) << rep.table();

  // Deterministic: a rebuild writes the same files.
  const std::string first = read_file(o.out_dir + "/cpp/test.jsonl");
  o.out_dir = dir + "/out2";
  build_corpus(o);
  EXPECT_EQ(read_file(o.out_dir + "/cpp/test.jsonl"), first);
}

TEST_F(PlantedCorpus, ShardsRoundTripThroughTheLoader) {
  o.tokenizer = source_path("tokenizer/slm-code-32k.model");
  auto rep = build_corpus(o);
  EXPECT_GT(rep.domains[0].tokens, 0u);
  ShardBuildOptions so;
  so.inputs = {o.out_dir};
  so.tokenizer = o.tokenizer;
  so.out_dir = dir + "/shards";
  so.max_shard_tokens = 3000;  // several shards per group
  auto groups = build_shards(so);
  auto tok = Tokenizer::load(o.tokenizer);
  std::map<std::string, ShardGroup> by_name;
  for (const auto& g : groups) by_name[g.name] = g;
  ASSERT_TRUE(by_name.count("cpp/train"));
  EXPECT_FALSE(by_name.count("data")) << "report.json is not a document";
  const auto& g = by_name["cpp/train"];
  EXPECT_GT(g.shards.size(), 1u);

  // Every document comes back byte-exact with its metadata.
  auto docs = read_jsonl(o.out_dir + "/cpp/train.jsonl");
  std::vector<uint32_t> stream;
  size_t k = 0;
  for (const auto& p : g.shards) {
    auto sh = Shard::open(p);
    auto meta = sh->metadata();
    for (uint64_t d = 0; d < sh->doc_count(); ++d, ++k) {
      auto ids = sh->document(d);
      ASSERT_EQ(ids.front(), tok.bos_id());
      ASSERT_EQ(ids.back(), tok.eos_id());
      ASSERT_LT(k, docs.size());
      EXPECT_EQ(tok.decode(ids), docs[k]["text"].get<std::string>());
      EXPECT_EQ(meta[d].path, docs[k]["path"].get<std::string>());
      EXPECT_EQ(meta[d].license, docs[k]["license"].get<std::string>());
      stream.insert(stream.end(), ids.begin(), ids.end());
    }
  }
  EXPECT_EQ(k, docs.size());

  // The loader's windows, in window order, rebuild the stream; doc ids rise at each BOS.
  TokenLoader loader({{"cpp", g.shards, 1.0}}, {.batch_size = 1, .seq_len = 64, .seed = 1});
  std::vector<int64_t> toks(65);
  std::vector<int32_t> seg(65);
  for (uint64_t w = 0; w < loader.windows(0); ++w) {
    loader.read_window(0, w, toks.data(), seg.data());
    for (int t = 0; t < 65; ++t) {
      ASSERT_EQ(static_cast<uint32_t>(toks[t]), stream[w * 64 + t]);
      if (t > 0) {
        ASSERT_EQ(seg[t] - seg[t - 1], toks[t] == tok.bos_id() ? 1 : 0);
      }
    }
  }
}

TEST_F(PlantedCorpus, DebianSourceTreesNameTheirPackageAndLicense) {
  // An unpacked source package (apt-get source): Source: from debian/control, License: from debian/copyright;
  // each domain's classifier picks its files from the same tree.
  const std::string tree = dir + "/data-src/leveldb-1.23";
  write_file(tree + "/debian/control", "Source: leveldb\nSection: libs\n");
  write_file(tree + "/debian/copyright", "Files: *\nCopyright: 2011 The LevelDB Authors\nLicense: BSD-3-clause\n");
  write_file(tree + "/db/db_impl.cc", random_code(500));
  write_file(tree + "/CMakeLists.txt",
             "cmake_minimum_required(VERSION 3.9)\nproject(leveldb VERSION 1.23.0 LANGUAGES C CXX)\n");
  write_file(tree + "/ci/build.sh", "#!/bin/sh\nset -e\ncmake -S . -B out && cmake --build out\n");
  o.roots["cpp"] = {{tree, "", "", false, {"/debian/"}, ""}};
  o.roots["cmake"] = {{tree, "", "", false, {"/debian/"}, ""}};
  o.roots["shell"] = {{tree, "", "", false, {"/debian/"}, ""}};
  o.validation_fraction = o.test_fraction = 0;
  auto rep = build_corpus(o);
  for (size_t d = 0; d < 3; ++d) EXPECT_EQ(rep.domains[d].documents, 1u) << o.domains[d];
  for (const auto& dom : o.domains) {
    auto docs = read_jsonl(o.out_dir + "/" + dom + "/train.jsonl");
    ASSERT_EQ(docs.size(), 1u);
    EXPECT_EQ(docs[0]["package"], "leveldb");
    EXPECT_EQ(docs[0]["license"], "BSD-3-clause");
  }
}

TEST_F(PlantedCorpus, SourcePackagesCarryEachFilesLicenseAndStayInOneSplit) {
  // slm data fetch's trees: each file's license is its DEP-5 paragraph's, and a project never straddles splits
  // (its files share code, so one split per package keeps the held-out sets honest).
  std::vector<std::string> trees;
  for (int p = 0; p < 12; ++p) {
    // Under a directory named "debian", as slm data fetch's cache is: only the packages' own debian/ is excluded.
    const std::string name = "proj" + std::to_string(p), tree = dir + "/debian/src/" + name + "_1.0";
    write_file(tree + "/debian/control", "Source: " + name + "\nSection: libs\n");
    write_file(tree + "/debian/copyright",
               "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\n"
               "License: GPL-2+\n\nFiles: vendor/*\nLicense: BSL-1.0\n");
    for (int f = 0; f < 4; ++f)
      write_file(tree + "/src/f" + std::to_string(f) + ".cpp", random_code(1000 + p * 10 + f));
    write_file(tree + "/vendor/v.hpp", random_code(2000 + p));
    trees.push_back(tree);
  }
  o.domains = {"cpp"};
  o.roots.clear();
  for (const auto& t : trees) o.roots["cpp"].push_back({t, "", "", false, {"/debian/"}, ""});
  o.validation_fraction = o.test_fraction = 0.25;
  auto rep = build_corpus(o);
  EXPECT_EQ(rep.domains[0].documents, 60u);
  std::map<std::string, std::set<std::string>> splits_of;  // package -> splits its files landed in
  std::set<std::string> splits_seen;
  for (const char* split : {"train", "validation", "test"}) {
    for (const auto& d : read_jsonl(o.out_dir + "/cpp/" + std::string(split) + ".jsonl")) {
      const std::string path = d["path"];
      EXPECT_EQ(d["license"], path.find("/vendor/") != std::string::npos ? "BSL-1.0" : "GPL-2+") << path;
      splits_of[d["package"]].insert(split);
      splits_seen.insert(split);
    }
  }
  EXPECT_EQ(splits_of.size(), 12u);
  for (const auto& [pkg, s] : splits_of) EXPECT_EQ(s.size(), 1u) << pkg << " is in several splits";
  EXPECT_GE(splits_seen.size(), 2u);  // with 12 packages and half held out, not everything is train
}
