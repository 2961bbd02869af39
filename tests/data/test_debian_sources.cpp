// Debian source packages for the corpora: debian/copyright (DEP-5) licenses per file, the license policy, dpkg's
// version order, the Sources index, the selection rules, the package list, and `SourceFetcher` end to end on a local
// archive built here with dpkg-source and dpkg-scansources (no network).
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "data_test_util.h"
#include "slm/data/debian_copyright.h"
#include "slm/data/debian_sources.h"
#include "slm/data/source_fetch.h"
#include "slm/util/files.h"
#include "slm/util/process.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

namespace {

const char* kDep5 = R"(Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: demo
Source: https://example.org/demo

Files: *
Copyright: 2020 Someone
License: MIT

Files: third_party/*
       vendor/blob.cpp
Copyright: 2019 Other
License: NonFree-Eval-Only
 Evaluation only; no redistribution.

Files: third_party/ok/*
Copyright: 2019 Third
License: BSD-3-clause

Files: src/star\*.cpp
License: GPL-2+ or Artistic

Files: ./docs/
License: CC-BY-NC-4.0

License: MIT
 Permission is hereby granted, free of charge, ...
)";

}  // namespace

TEST(DebianCopyright, LastMatchingFilesParagraphGivesTheLicense) {
  const auto c = DebianCopyright::parse(kDep5);
  EXPECT_TRUE(c.machine_readable());
  EXPECT_EQ(c.license_of("src/a.cpp"), "MIT");
  EXPECT_EQ(c.license_of("third_party/x/y.h"), "NonFree-Eval-Only");  // '*' crosses '/'
  EXPECT_EQ(c.license_of("vendor/blob.cpp"), "NonFree-Eval-Only");    // a continuation-line pattern
  EXPECT_EQ(c.license_of("third_party/ok/z.cpp"), "BSD-3-clause");    // later paragraph wins
  EXPECT_EQ(c.license_of("src/star*.cpp"), "GPL-2+ or Artistic");     // escaped '*' is literal
  EXPECT_EQ(c.license_of("src/starx.cpp"), "MIT");
  EXPECT_EQ(c.license_of("docs/guide/intro.md"), "CC-BY-NC-4.0");  // "./dir/" as a directory
  EXPECT_EQ(c.main_license(), "MIT");
}

TEST(DebianCopyright, FreeTextFilesAreGuessedForTheWholePackage) {
  const auto c = DebianCopyright::parse(
      "This package was debianized by someone.\n\nIt is licensed under the Boost Software License, Version 1.0.\n");
  EXPECT_FALSE(c.machine_readable());
  EXPECT_EQ(c.license_of("any/file.cpp"), "BSL-1.0");
  EXPECT_EQ(DebianCopyright::parse("nothing recognisable").license_of("a.cpp"), "");
  EXPECT_EQ(DebianCopyright::read("/nonexistent/copyright").license_of("a.cpp"), "");
}

TEST(Dep5Match, GlobRules) {
  EXPECT_TRUE(dep5_match("*", "a/b/c.cpp"));
  EXPECT_TRUE(dep5_match("src/*.h", "src/x/y.h"));
  EXPECT_FALSE(dep5_match("src/*.h", "src/x/y.hpp"));
  EXPECT_TRUE(dep5_match("a?c", "abc"));
  EXPECT_FALSE(dep5_match("a?c", "ac"));
  EXPECT_TRUE(dep5_match("*.cpp", "x.cpp"));
  EXPECT_TRUE(dep5_match("lib*-dev", "libboost-dev"));
  EXPECT_FALSE(dep5_match("lib*-dev", "libboost-doc"));
  EXPECT_TRUE(dep5_match("a\\?", "a?"));
  EXPECT_FALSE(dep5_match("a\\?", "ab"));
  EXPECT_TRUE(dep5_match("./src/a.cpp", "src/a.cpp"));
}

TEST(LicensePolicy, ExpressionsAlternativesAndExceptions) {
  const LicensePolicy p({"Expat", "BSD-*", "GPL-2", "GPL-3", "Artistic", "Apache-2.0"});
  EXPECT_TRUE(p.allows("Expat"));
  EXPECT_TRUE(p.allows("expat"));
  EXPECT_TRUE(p.allows("GPL-2+"));
  EXPECT_TRUE(p.allows("GPL-2.0-or-later"));
  EXPECT_TRUE(p.allows("GPL-3+ with OpenSSL exception"));
  EXPECT_TRUE(p.allows("BSD-3-clause"));
  EXPECT_TRUE(p.allows("Apache-2"));
  EXPECT_TRUE(p.allows("NonFree or GPL-2+"));    // either may be chosen
  EXPECT_FALSE(p.allows("NonFree and GPL-2+"));  // both apply
  EXPECT_FALSE(p.allows("GPL-2+, NonFree"));
  EXPECT_TRUE(p.allows("(GPL-2+ and BSD-2-clause) or NonFree"));
  EXPECT_FALSE(p.allows("LGPL-2.1"));  // not listed: LGPL is not GPL
  EXPECT_FALSE(p.allows("CC-BY-NC-4.0"));
  EXPECT_FALSE(p.allows(""));
  EXPECT_FALSE(p.allows("   "));
}

TEST(LicensePolicy, TheShippedPolicyKeepsFreeLicensesAndDropsTheRest) {
  const auto cfg = nlohmann::json::parse(test::read_file(test::source_path("recipes/data/debian.json")));
  const auto p = LicensePolicy::from_json(cfg["licenses"], "debian.json");
  for (const char* ok : {"Expat", "MIT", "BSD-3-clause", "BSL-1.0", "Apache-2.0", "GPL-2+", "LGPL-2.1+", "Zlib",
                         "public-domain", "MPL-2.0", "GPL-3+ with GCC-exception-3.1"})
    EXPECT_TRUE(p.allows(ok)) << ok;
  for (const char* bad : {"CC-BY-NC-4.0", "CC-BY-ND-4.0", "other", "unknown", "NonFree", "", "Proprietary"})
    EXPECT_FALSE(p.allows(bad)) << bad;
  EXPECT_NE(error_of([] {
              LicensePolicy::from_json(nlohmann::json{{"allowed", {"MIT", 3}}}, "x.json");
            }).find("x.json: \"allowed\" must hold strings"),
            std::string::npos);
  EXPECT_NE(error_of([] { LicensePolicy::from_json(nlohmann::json::object(), "x.json"); }).find("x.json"),
            std::string::npos);
}

TEST(DebianVersions, OrderMatchesDpkg) {
  // Hand-checked orders from Debian Policy 5.6.12, then the same pairs against dpkg itself when it is installed.
  const std::vector<std::pair<std::string, std::string>> less = {{"1.0", "1.1"},
                                                                 {"1.0~rc1", "1.0"},
                                                                 {"1.0", "1.0-1"},
                                                                 {"1.0-1", "1.0-2"},
                                                                 {"1.9", "1.10"},
                                                                 {"1.0", "1:0.1"},
                                                                 {"2.0~~", "2.0~"},
                                                                 {"1.0a", "1.0b"},
                                                                 {"1.0", "1.0a"},
                                                                 {"1.0a", "1.0+"},
                                                                 {"0.0~git1", "0.0.1"},
                                                                 {"4:22.12.3-1", "5:0"},
                                                                 {"1.2.3-1~bpo1", "1.2.3-1"},
                                                                 {"9.1.0+ds1-2", "9.1.0+ds1-10"}};
  for (const auto& [a, b] : less) {
    EXPECT_LT(compare_debian_versions(a, b), 0) << a << " < " << b;
    EXPECT_GT(compare_debian_versions(b, a), 0) << b << " > " << a;
    EXPECT_EQ(compare_debian_versions(a, a), 0);
  }
  EXPECT_EQ(compare_debian_versions("1.01", "1.1"), 0);
  EXPECT_EQ(compare_debian_versions("0:1.0", "1.0"), 0);
  if (!program_available("dpkg")) GTEST_SKIP() << "dpkg not installed: checked against the hand-made list only";
  for (const auto& [a, b] : less) {
    const auto r = run_process({"dpkg", "--compare-versions", a, "lt", b});
    EXPECT_TRUE(r.ok()) << "dpkg disagrees: " << a << " < " << b;
  }
}

TEST(SourcesIndex, ParsesPackagesDependenciesAndSizesKeepingTheHighestVersion) {
  std::istringstream in(R"(Package: zeta
Version: 1.0-1
Build-Depends: debhelper-compat (= 13), cmake (>= 3.16) [!hurd-any], libfoo-dev | libbar-dev,
 python3:any <!nocheck>, qtbase5-dev
Build-Depends-Indep: doxygen
Directory: pool/main/z/zeta
Files:
 0123 1000 zeta_1.0-1.dsc
 4567 250000 zeta_1.0.orig.tar.xz

Package: alpha
Version: 2.0-1
Build-Depends: debhelper-compat (= 13)
Directory: pool/main/a/alpha
Files:
 aaaa 10 alpha_2.0-1.dsc

Package: zeta
Version: 1.0~rc1-1
Build-Depends: make
Files:
 0123 5 zeta_1.0~rc1-1.dsc
)");
  const auto idx = parse_sources_index(in);
  ASSERT_EQ(idx.size(), 2u);
  EXPECT_EQ(idx[0].name, "alpha");
  EXPECT_EQ(idx[1].name, "zeta");
  EXPECT_EQ(idx[1].version, "1.0-1");  // 1.0~rc1-1 sorts lower
  EXPECT_EQ(idx[1].bytes, 251000u);
  EXPECT_EQ(idx[1].directory, "pool/main/z/zeta");
  const std::vector<std::string> deps = {"debhelper-compat", "cmake",       "libfoo-dev", "libbar-dev",
                                         "python3",          "qtbase5-dev", "doxygen"};
  EXPECT_EQ(idx[1].build_depends, deps);

  SelectionRules r;
  r.build_depends_any = {"cmake", "libboost*"};
  r.exclude = {"*-data"};
  r.max_bytes = 200000;
  EXPECT_EQ(selection_verdict(idx[0], r), "no build dependency matches");
  EXPECT_NE(selection_verdict(idx[1], r).find("over the limit"), std::string::npos);
  r.max_bytes = 0;
  EXPECT_EQ(selection_verdict(idx[1], r), "");
  SourcePackage data_pkg = idx[1];
  data_pkg.name = "zeta-data";
  EXPECT_EQ(selection_verdict(data_pkg, r), "excluded by name");
  r.include = {"alpha"};
  EXPECT_EQ(selection_verdict(idx[0], r), "");
  EXPECT_NE(error_of([] {
              SelectionRules::from_json(nlohmann::json{{"buildepends", {"cmake"}}}, "d.json");
            }).find("unknown field \"buildepends\""),
            std::string::npos);
}

TEST(PackageList, RoundTripsAndNamesTheBadLine) {
  const std::string dir = fresh_dir("list");
  const std::vector<ListedPackage> list = {{"a", "1.0-1", 10}, {"b", "2:3~rc-4", 0}};
  write_file(dir + "/p.txt", format_package_list(list, "two packages\nsecond line"));
  const auto back = read_package_list(dir + "/p.txt");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].name, "b");
  EXPECT_EQ(back[1].version, "2:3~rc-4");
  EXPECT_EQ(back[0].bytes, 10u);
  write_file(dir + "/bad.txt", "# c\na 1.0 12\nlonely\n");
  EXPECT_NE(error_of([&] { read_package_list(dir + "/bad.txt"); }).find("bad.txt:3"), std::string::npos);
  write_file(dir + "/bad2.txt", "a 1.0 many\n");
  EXPECT_NE(error_of([&] { read_package_list(dir + "/bad2.txt"); }).find("bad2.txt:1"), std::string::npos);
}

namespace {

// A "3.0 (native)" source package built by dpkg-source -b into `repo`.
void build_source_package(const std::string& work, const std::string& repo, const std::string& name,
                          const std::string& version, const std::string& build_depends, const std::string& copyright,
                          const std::map<std::string, std::string>& files) {
  const std::string root = work + "/" + name;
  write_file(root + "/debian/source/format", "3.0 (native)\n");
  write_file(root + "/debian/control", "Source: " + name +
                                           "\nSection: libs\nPriority: optional\nMaintainer: T <t@example.org>\n"
                                           "Build-Depends: " +
                                           build_depends + "\nStandards-Version: 4.6.0\n\nPackage: lib" + name +
                                           "\nArchitecture: any\nDescription: test\n test\n");
  write_file(root + "/debian/changelog", name + " (" + version +
                                             ") unstable; urgency=medium\n\n  * Test.\n\n -- T <t@example.org>  Mon, "
                                             "01 Jan 2024 00:00:00 +0000\n");
  write_file(root + "/debian/copyright", copyright);
  write_file(root + "/debian/rules", "#!/usr/bin/make -f\n%:\n\tdh $@\n");
  for (const auto& [path, text] : files) write_file(root + "/" + path, text);
  ProcessOptions po;
  po.cwd = work;
  po.merge_stderr = true;
  const auto r = run_process({"dpkg-source", "-b", name}, po);
  ASSERT_TRUE(r.ok()) << r.out;
  for (const char* ext : {".dsc", ".tar.xz"}) {
    const std::string f = name + "_" + version + ext;
    ASSERT_EQ(std::rename((work + "/" + f).c_str(), (repo + "/" + f).c_str()), 0) << f;
  }
}

void index_repo(const std::string& repo) {
  ProcessOptions po;
  po.cwd = repo;
  const auto r = run_process({"dpkg-scansources", "."}, po);
  ASSERT_TRUE(r.ok()) << r.err;
  write_file(repo + "/Sources", r.out);
}

}  // namespace

TEST(SourceFetcher, FetchesPrunesByLicenseAndResumesFromALocalArchive) {
  for (const char* tool : {"apt-get", "dpkg-source", "dpkg-scansources", "xz"})
    if (!program_available(tool)) GTEST_SKIP() << tool << " not installed";
  const std::string dir = fresh_dir("fetch"), work = dir + "/work", repo = dir + "/repo", cache = dir + "/cache";
  slm::make_dirs(work);
  slm::make_dirs(repo);
  const std::string dep5 = std::string(kDep5);
  std::map<std::string, std::string> demo_files = {
      {"src/a.cpp", random_code(1)},
      {"src/b.h", random_code(2)},
      {"src/c.cc", random_code(3)},
      {"src/d.hpp", random_code(4)},
      {"src/e.cxx", random_code(5)},
      {"CMakeLists.txt", "cmake_minimum_required(VERSION 3.16)\nproject(demo CXX)\nadd_library(demo src/a.cpp)\n"},
      {"tools/run", "#!/bin/sh\nset -e\necho running\n"},
      {"README.md", "# demo\n\nA planted package.\n"},
      {"third_party/lib.cpp", random_code(6)},                                          // NonFree-Eval-Only: must go
      {"third_party/ok/fine.cpp", random_code(7)},                                      // BSD-3-clause: stays
      {"docs/guide.md", "# guide\n\nnon-commercial text\n"},                            // CC-BY-NC: must go
      {"data/image.png", std::string("\x89PNG\r\n\x1a\n", 8) + std::string(64, '\0')},  // not corpus material
      {"src/huge.cpp", std::string(300000, 'x')},                                       // over max_file_bytes
      {"debian/patches/01-fix-crash.patch", "Description: fix a crash\n--- a/src/a.cpp\n+++ b/src/a.cpp\n"},
      {"debian/patches/series", "01-fix-crash.patch\n"},
  };
  build_source_package(work, repo, "demo", "1.0", "debhelper-compat (= 13), cmake", dep5, demo_files);
  build_source_package(work, repo, "tiny", "0.5", "cmake", dep5, {{"src/only.cpp", random_code(8)}});
  build_source_package(work, repo, "gone", "2.0", "cmake", dep5, {{"src/x.cpp", random_code(9)}});
  build_source_package(work, repo, "other", "1.0", "debhelper-compat (= 13)", dep5, {{"src/y.cpp", random_code(10)}});
  index_repo(repo);
  ASSERT_EQ(std::remove((repo + "/gone_2.0.tar.xz").c_str()), 0);  // indexed, then missing from the archive

  FetchOptions o;
  o.cache_dir = cache;
  o.mirror = "file:" + repo;
  o.suite = "./";
  o.component = "";
  o.keyring = "";
  o.rate_mb_s = 0;
  o.max_file_bytes = 200000;
  o.rules.build_depends_any = {"cmake"};
  o.rules.min_cpp_files = 2;
  o.licenses = LicensePolicy({"MIT", "BSD-*"});
  SourceFetcher f(o);
  EXPECT_FALSE(f.has_index());
  f.update_index();
  ASSERT_TRUE(f.has_index());
  ASSERT_EQ(f.index().size(), 4u);
  const auto list = f.select();
  ASSERT_EQ(list.size(), 3u);  // "other" has no cmake build dependency
  EXPECT_EQ(list[0].name, "demo");
  EXPECT_EQ(list[1].name, "gone");
  EXPECT_EQ(list[2].name, "tiny");

  std::vector<std::string> seen;
  uint64_t last_done = 0, last_total = 0;
  const auto s = f.fetch(
      list, false, [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; },
      [&](const PackageOutcome& p) { seen.push_back(p.name + ":" + p.status); });
  EXPECT_EQ(seen, (std::vector<std::string>{"demo:ok", "gone:unavailable", "tiny:rejected"}));
  EXPECT_EQ(s.ok, 1u);
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.unavailable, 1u);
  EXPECT_EQ(last_done, last_total);
  EXPECT_GT(last_total, 0u);

  const std::string root = f.source_dir() + "/demo_1.0";
  for (const char* kept :
       {"src/a.cpp", "src/b.h", "src/c.cc", "src/d.hpp", "src/e.cxx", "CMakeLists.txt", "tools/run", "README.md",
        "third_party/ok/fine.cpp", "debian/copyright", "debian/control", "debian/changelog",
        "debian/patches/01-fix-crash.patch", "debian/patches/series", ".slm-package.json"})
    EXPECT_EQ(::access((root + "/" + kept).c_str(), F_OK), 0) << kept;
  for (const char* gone :
       {"third_party/lib.cpp", "docs/guide.md", "data/image.png", "src/huge.cpp", "debian/rules", "data", "docs"})
    EXPECT_NE(::access((root + "/" + gone).c_str(), F_OK), 0) << gone;
  EXPECT_EQ(test::read_file(root + "/src/a.cpp"), demo_files["src/a.cpp"]);
  const auto rec = f.recorded();
  const auto& demo = rec.at("demo 1.0");
  EXPECT_EQ(demo.cpp_files, 6u);
  EXPECT_EQ(demo.dropped_license_files, 2u);
  EXPECT_EQ(demo.dropped_licenses.at("NonFree-Eval-Only"), 1u);
  EXPECT_EQ(demo.dropped_licenses.at("CC-BY-NC-4.0"), 1u);
  EXPECT_EQ(demo.kept_licenses.at("BSD-3-clause"), 1u);
  EXPECT_NE(::access((f.source_dir() + "/tiny_0.5").c_str(), F_OK), 0);  // 1 C++ file < min_cpp_files
  EXPECT_NE(rec.at("tiny 0.5").reason.find("1 C++ files"), std::string::npos);

  // Resume: nothing is fetched again, except a package whose unpacked tree went missing.
  seen.clear();
  auto again = f.fetch(list, false, {}, [&](const PackageOutcome& p) { seen.push_back(p.name); });
  EXPECT_TRUE(seen.empty());
  EXPECT_EQ(again.skipped, 3u);
  test::remove_tree(root);
  again = f.fetch(list, false, {}, [&](const PackageOutcome& p) { seen.push_back(p.name + ":" + p.status); });
  EXPECT_EQ(seen, (std::vector<std::string>{"demo:ok"}));
  EXPECT_EQ(test::read_file(root + "/src/a.cpp"), demo_files["src/a.cpp"]);
  seen.clear();
  f.fetch(list, /*retry_unavailable=*/true, {}, [&](const PackageOutcome& p) { seen.push_back(p.name); });
  EXPECT_EQ(seen, (std::vector<std::string>{"gone"}));
  // A version the archive does not list fails (retried by the next run), and nothing is left behind.
  seen.clear();
  const auto bad = f.fetch({{"demo", "9.9", 0}}, false, {}, [&](const PackageOutcome& p) { seen.push_back(p.status); });
  EXPECT_EQ(seen, (std::vector<std::string>{"failed"}));
  EXPECT_EQ(bad.failed, 1u);
  EXPECT_NE(::access((cache + "/tmp/demo").c_str(), F_OK), 0);
}

// The real archive, opt-in (SLM_NETWORK_TESTS=1; CI never sets it): one small package (21 KB of downloads, reachable
// from the development machine on 2026-11-27) through `slm data fetch --packages`: apt's private state and the
// Sources index, the download, unpacking, pruning and the license check; then a second run that finds it done.
TEST(SourceFetcher, RealArchiveFetchesOnePackageOptIn) {
  const char* on = std::getenv("SLM_NETWORK_TESTS");
  if (!on || std::string(on) != "1") GTEST_SKIP() << "set SLM_NETWORK_TESTS=1 to fetch from deb.debian.org";
  const std::string dir = fresh_dir("net"), list = dir + "/packages.txt";
  test::write_file(list, "libevdevplus 0.1.1-2 21498\n");
  auto r = run_slm("data fetch --cache " + dir + "/cache --packages " + list);
  ASSERT_EQ(r.code, 0) << r.out;
  std::string last;
  std::istringstream state(test::read_file(dir + "/cache/fetch-state.jsonl"));
  for (std::string line; std::getline(state, line);) last = line;
  const auto outcome = nlohmann::json::parse(last);
  EXPECT_EQ(outcome["package"], "libevdevplus");
  ASSERT_EQ(outcome["status"], "ok") << last;
  EXPECT_GT(outcome["cpp_files"].get<int>(), 0);
  const std::string tree = dir + "/cache/src/libevdevplus_0.1.1-2";
  EXPECT_TRUE(std::filesystem::exists(tree + "/.slm-package.json"));
  EXPECT_TRUE(std::filesystem::exists(tree + "/debian/copyright"));
  auto again = run_slm("data fetch --cache " + dir + "/cache --packages " + list);
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(std::filesystem::exists(tree + "/.slm-package.json"));
}
