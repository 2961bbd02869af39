// Debug and review documents from debian/patches: DEP-3, git format-patch and quilt headers; bug-fix
// classification; the license gate; and the documents inside `slm data build`.
#include "data_test_util.h"
#include "slm/data/corpus.h"
#include "slm/data/gen_patches.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

namespace {

const char* kDep3 = R"(Description: Fix a use-after-free in the parser
 The tokenizer kept a pointer into the input buffer after the buffer was
 reallocated by append().
 .
 Keep an offset instead of a pointer.
Author: Jane Doe <jane@example.org>
Origin: upstream, https://example.org/commit/abc
Bug-Debian: https://bugs.debian.org/123456
Forwarded: not-needed
Last-Update: 2023-01-02
---
This patch header follows DEP-3: http://dep.debian.net/deps/dep3/
--- a/src/parser.cpp
+++ b/src/parser.cpp
@@ -10,7 +10,7 @@ void Parser::feed(const std::string& s) {
   buffer_.append(s);
-  const char* p = cursor_;
+  const char* p = buffer_.data() + offset_;
   parse(p);
 }
)";

const char* kGit = R"(From 5a0e2cb5e3958dd90bb8569a2766622cb74d90c1 Mon Sep 17 00:00:00 2001
From: Dev <dev@example.org>
Date: Thu, 23 Jan 2025 06:33:43 -0800
Subject: [PATCH 2/3] Build with GCC 13: add the missing <cstdint> include

GCC 13 no longer includes <cstdint> through <string>.
---
 src/io.h | 1 +
 1 file changed, 1 insertion(+)

diff --git a/src/io.h b/src/io.h
index 1111111..2222222 100644
--- a/src/io.h
+++ b/src/io.h
@@ -1,3 +1,4 @@
 #pragma once
+#include <cstdint>
 #include <string>
)";

const char* kQuilt = R"(Install the pkg-config file into the multiarch directory.

Index: demo-1.0/CMakeLists.txt
===================================================================
--- demo-1.0.orig/CMakeLists.txt
+++ demo-1.0/CMakeLists.txt
@@ -20,1 +20,1 @@
-install(FILES demo.pc DESTINATION lib/pkgconfig)
+install(FILES demo.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
)";

}  // namespace

TEST(DebianPatches, ParsesDep3GitAndQuiltHeaders) {
  const auto a = parse_patch(kDep3);
  EXPECT_EQ(a.subject, "Fix a use-after-free in the parser");
  EXPECT_EQ(a.body,
            "The tokenizer kept a pointer into the input buffer after the buffer was\nreallocated by append().\n\n"
            "Keep an offset instead of a pointer.");
  EXPECT_TRUE(a.diff.starts_with("--- a/src/parser.cpp\n+++ b/src/parser.cpp\n@@ -10,7"));
  EXPECT_EQ(a.files, (std::vector<std::string>{"src/parser.cpp"}));
  EXPECT_EQ(a.body.find("Jane"), std::string::npos);  // header fields are not description
  EXPECT_EQ(a.body.find("DEP-3"), std::string::npos);

  const auto g = parse_patch(kGit);
  EXPECT_EQ(g.subject, "Build with GCC 13: add the missing <cstdint> include");
  EXPECT_EQ(g.body, "GCC 13 no longer includes <cstdint> through <string>.");
  EXPECT_TRUE(g.diff.starts_with("diff --git a/src/io.h b/src/io.h\n"));
  EXPECT_EQ(g.diff.find("1 file changed"), std::string::npos);  // the diffstat is dropped
  EXPECT_EQ(g.files, (std::vector<std::string>{"src/io.h"}));

  const auto q = parse_patch(kQuilt);
  EXPECT_EQ(q.subject, "Install the pkg-config file into the multiarch directory.");
  EXPECT_EQ(q.body, "");
  EXPECT_EQ(q.files, (std::vector<std::string>{"CMakeLists.txt"}));  // "demo-1.0/" is the tree's own name

  EXPECT_EQ(parse_patch("--- a/x.c\n+++ b/x.c\n@@ -1 +1 @@\n-a\n+b\n").subject, "");
}

TEST(DebianPatches, ClassifiesBugFixesBySymptom) {
  EXPECT_EQ(classify_patch(parse_patch(kDep3)), "memory");
  EXPECT_EQ(classify_patch(parse_patch(kGit)), "build");
  EXPECT_EQ(classify_patch(parse_patch(kQuilt)), "");
  EXPECT_EQ(classify_patch({"Fix segfault when the config file is empty", "", "", {}}), "crash");
  EXPECT_EQ(classify_patch({"Avoid a data race on the cache counter", "", "", {}}), "concurrency");
  EXPECT_EQ(classify_patch({"Initialise member before use",
                            "valgrind: conditional jump depends on uninitialised "
                            "value",
                            "",
                            {}}),
            "memory");  // the most specific kind named wins: valgrind before "uninitialised"
  EXPECT_EQ(classify_patch({"Fix FTBFS with ICU 72", "", "", {}}), "build");
  EXPECT_EQ(classify_patch({"Add a --quiet option", "", "", {}}), "");
  // Words, not substrings; and "leak" alone is not a memory error (abseil's "Do not leak -maes into pkgconfig").
  EXPECT_EQ(classify_patch({"Do not leak -maes -msse4.1 into pkgconfig", "", "", {}}), "");
  EXPECT_EQ(classify_patch({"Make the dialog more pleasant", "", "", {}}), "");
  EXPECT_EQ(classify_patch({"Fix build failures with Qt 6.4", "", "", {}}), "build");
}

namespace {

void plant_package(const std::string& root, const std::string& name,
                   const std::vector<std::pair<std::string, std::string>>& patches) {
  write_file(root + "/debian/control", "Source: " + name + "\nSection: libs\n");
  write_file(root + "/debian/changelog", name + " (1.2-3) unstable; urgency=medium\n\n  * x\n");
  write_file(root + "/debian/copyright",
             "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nLicense: MIT\n\n"
             "Files: vendor/*\nLicense: NonFree\n");
  std::string series = "# applied in this order\n";
  for (const auto& [n, text] : patches) {
    write_file(root + "/debian/patches/" + n, text);
    series += n + " -p1\n";
  }
  write_file(root + "/debian/patches/series", series);
}

}  // namespace

TEST(DebianPatches, DocumentsFollowTheSeriesAndTheLicenseGate) {
  const std::string dir = fresh_dir("patches");
  plant_package(dir + "/demo", "demo",
                {{"02-uaf.patch", kDep3},
                 {"01-gcc13.patch", kGit},
                 {"03-multiarch.patch", kQuilt},
                 {"04-packaging.patch",
                  "Description: Tweak the packaging only\n--- a/debian/x\n+++ b/debian/x\n"
                  "@@ -1 +1 @@\n-a\n+b\n"},
                 {"05-vendor.patch",
                  "Description: Fix a crash in the vendored zlib\n--- a/vendor/z.c\n"
                  "+++ b/vendor/z.c\n@@ -1 +1 @@\n-a\n+b\n"},
                 {"06-nodesc.patch", "--- a/src/a.cpp\n+++ b/src/a.cpp\n@@ -1 +1 @@\n-a\n+b\n"}});
  write_file(dir + "/demo/debian/patches/07-unlisted.patch", kDep3);  // not in the series: not applied
  PatchStats st;
  const auto c = generate_patch_corpus({dir + "/demo"}, LicensePolicy({"MIT"}), 64000, &st);
  EXPECT_EQ(st.packages, 1u);
  EXPECT_EQ(st.patches, 6u);  // the series, not the directory
  EXPECT_EQ(st.no_code, 1u);
  EXPECT_EQ(st.license, 1u);
  EXPECT_EQ(st.no_description, 1u);
  ASSERT_EQ(c.debug.size(), 2u);
  ASSERT_EQ(c.review.size(), 1u);
  EXPECT_EQ(c.debug[0].meta.path, "debian/patches/02-uaf.patch");  // series order, not the names'
  EXPECT_EQ(c.debug[1].meta.path, "debian/patches/01-gcc13.patch");
  const auto& uaf = c.debug[0];
  EXPECT_EQ(uaf.meta.package, "demo");
  EXPECT_EQ(uaf.meta.license, "MIT");
  EXPECT_EQ(uaf.meta.domain, "debug");
  EXPECT_EQ(uaf.split_key, "package:demo");
  EXPECT_EQ(uaf.extra["category"], "memory");
  EXPECT_EQ(uaf.extra["version"], "1.2-3");
  const std::string& t = uaf.text;
  const size_t sym = t.find("Symptom:\nFix a use-after-free"), diag = t.find("Diagnosis:\nThe tokenizer"),
               fix = t.find("Fix:\n--- a/src/parser.cpp");
  ASSERT_NE(sym, std::string::npos) << t;
  ASSERT_NE(diag, std::string::npos) << t;
  ASSERT_NE(fix, std::string::npos) << t;
  EXPECT_LT(sym, diag);
  EXPECT_LT(diag, fix);
  const auto& rev = c.review[0];
  EXPECT_EQ(rev.meta.domain, "review");
  EXPECT_LT(rev.text.find("+install(FILES demo.pc"), rev.text.find("Review:\nInstall the pkg-config file"));
  EXPECT_EQ(st.categories.at("build"), 1u);
  EXPECT_EQ(st.categories.at("memory"), 1u);
}

TEST(DebianPatches, BuildCorpusAddsThemToDebugAndReview) {
  const std::string dir = fresh_dir("corpus");
  plant_package(dir + "/src/demo", "demo", {{"01-gcc13.patch", kGit}, {"02-uaf.patch", kDep3}, {"03.patch", kQuilt}});
  CorpusOptions o;
  o.domains = {"debug", "review"};
  o.out_dir = dir + "/out";
  o.roots["debug"] = {};
  o.roots["review"] = {};
  o.debug.variants = 0;         // no compiled bug programs: only the patches
  o.review.files_per_root = 0;  // no clang-tidy runs
  o.source_packages = {dir + "/src/demo"};
  o.patch_licenses = LicensePolicy({"MIT"});
  o.min_file_bytes = 16;
  o.validation_fraction = o.test_fraction = 0;
  o.generated_held_out = 0;
  const auto rep = build_corpus(o);
  EXPECT_EQ(rep.domains[0].documents, 2u);
  EXPECT_EQ(rep.domains[1].documents, 1u);
  EXPECT_EQ(rep.domains[0].generator["debian_patches"]["debug"], 2);
  const auto debug = read_jsonl(o.out_dir + "/debug/train.jsonl");
  ASSERT_EQ(debug.size(), 2u);
  EXPECT_EQ(debug[0]["package"], "demo");
  EXPECT_EQ(debug[0]["category"], "build");
  EXPECT_EQ(read_jsonl(o.out_dir + "/review/train.jsonl").size(), 1u);
}
