// The generated and converted domains: debug samples carry the sanitizer's/compiler's real report for the planted
// fault and a fix that really compiles and runs clean; review documents pair clang-tidy diagnostics with the fix
// diff on the right lines; documentation converts to text without markup; the algorithm rule keeps files out of
// cpp; router requests are labelled with, balanced over and split like their source documents.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "data_test_util.h"
#include "slm/data/corpus.h"
#include "slm/data/doc_text.h"
#include "slm/data/gen_debug.h"
#include "slm/data/gen_review.h"
#include "slm/data/gen_router.h"
#include "slm/data/hashing.h"
#include "slm/data/text.h"
#include "slm/util/process.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

namespace {

const BugCase& bug_case(const std::string& id) {
  for (const auto& c : bug_catalogue())
    if (c.id == id) return c;
  throw Error("no bug case " + id);
}

// 1-based number of the first line of `text` containing `needle` (0 if none).
int line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  if (at == std::string::npos) return 0;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
}

// Compiles and runs a program with the shell (independently of the generator's process runner);
// returns the exit status and the combined output.
std::pair<int, std::string> sh(const std::string& dir, const std::string& cmd) {
  const std::string log = dir + "/sh.log";
  const int status = std::system(("cd '" + dir + "' && (" + cmd + ") > sh.log 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(log)};
}

DebugOptions debug_options(const std::string& dir) {
  DebugOptions o;
  o.work_dir = dir;
  return o;
}

}  // namespace

TEST(DebugCorpus, SanitizerReportIsRealAndTheFixRunsClean) {
  const std::string dir = fresh_dir("d");
  const auto& c = bug_case("heap-buffer-overflow/off-by-one-loop");
  const auto s = run_bug_case(c, 0, debug_options(dir));  // variant 0: g++
  ASSERT_TRUE(s.reproduced) << s.why_dropped << "\n" << s.output;
  EXPECT_EQ(s.compiler, "g++");
  EXPECT_NE(s.output.find("ERROR: AddressSanitizer: heap-buffer-overflow"), std::string::npos) << s.output;
  // The report points at the planted write: file and line of the `<=` loop.
  const int bad_line = line_of(s.code, "i <= n");
  ASSERT_GT(bad_line, 0);
  EXPECT_NE(s.output.find(s.file + ":" + std::to_string(bad_line)), std::string::npos) << s.output;
  EXPECT_EQ(s.output.find("Shadow byte legend"), std::string::npos);
  EXPECT_EQ(s.output.find(dir), std::string::npos) << "the private build directory leaks into the output";
  // The document pairs code, output and fix.
  EXPECT_NE(s.text.find(s.code), std::string::npos);
  EXPECT_NE(s.text.find(s.output), std::string::npos);
  ASSERT_TRUE(s.fix_verified);
  EXPECT_NE(s.text.find(s.fixed), std::string::npos);
  EXPECT_EQ(s.fixed.find("i <= n"), std::string::npos);
  // Independently: the fixed program builds with the same flags and runs without a report.
  write_file(dir + "/fixed.cpp", s.fixed);
  auto [rc, out] = sh(dir, "g++ -std=c++20 -g -O0 -fsanitize=address,undefined fixed.cpp -o fixed && ./fixed");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("Sanitizer"), std::string::npos) << out;
  // ... and the faulty one, built the same way, fails.
  write_file(dir + "/bug.cpp", s.code);
  auto [brc, bout] = sh(dir, "g++ -std=c++20 -g -O0 -fsanitize=address bug.cpp -o bug && ./bug");
  EXPECT_NE(brc, 0);
  EXPECT_NE(bout.find("heap-buffer-overflow"), std::string::npos);
}

TEST(DebugCorpus, UbsanAndCompilerDiagnosticsNameTheFault) {
  const std::string dir = fresh_dir("d");
  const auto ub = run_bug_case(bug_case("signed-overflow/binary-search-midpoint"), 0, debug_options(dir));
  ASSERT_TRUE(ub.reproduced) << ub.why_dropped << "\n" << ub.output;
  EXPECT_NE(ub.output.find(ub.file + ":" + std::to_string(line_of(ub.code, "(lo + hi) / 2")) + ":"), std::string::npos)
      << ub.output;
  EXPECT_NE(ub.output.find("runtime error: signed integer overflow"), std::string::npos);
  EXPECT_TRUE(ub.fix_verified);

  const auto ce = run_bug_case(bug_case("compile-error/missing-semicolon-statement"), 0, debug_options(dir));
  ASSERT_TRUE(ce.reproduced) << ce.why_dropped << "\n" << ce.output;
  // g++ reports the missing ';' at the statement that lacks it (or the line after it).
  const int decl = line_of(ce.code, "= x *");
  const bool at_decl = ce.output.find(ce.file + ":" + std::to_string(decl) + ":") != std::string::npos;
  const bool at_next = ce.output.find(ce.file + ":" + std::to_string(decl + 1) + ":") != std::string::npos;
  EXPECT_TRUE(at_decl || at_next) << ce.output;
  EXPECT_NE(ce.output.find("error: expected"), std::string::npos) << ce.output;
  ASSERT_TRUE(ce.fix_verified);
  write_file(dir + "/fixed.cpp", ce.fixed);
  EXPECT_EQ(sh(dir, "g++ -std=c++20 fixed.cpp -o fixed && ./fixed").first, 0);
}

TEST(DebugCorpus, EveryCaseFillsAndVariantsDiffer) {
  std::set<std::string> ids;
  for (const auto& c : bug_catalogue()) {
    EXPECT_TRUE(ids.insert(c.id).second) << "duplicate case id " << c.id;
    EXPECT_FALSE(c.expect.empty()) << c.id;
    std::set<std::string> codes;
    for (int v = 0; v < 4; ++v) {
      const auto slots = debug_slots(c, v);
      EXPECT_EQ(slots, debug_slots(c, v)) << "slots are not deterministic";
      EXPECT_NE(slots.at("A"), slots.at("B"));
      const std::string code = fill_slots(c.code, slots);
      EXPECT_EQ(code.find("${"), std::string::npos) << c.id;
      if (!c.fixed.empty()) {
        EXPECT_NE(fill_slots(c.fixed, slots), code) << c.id << ": the fix changes nothing";
      }
      codes.insert(code);
    }
    EXPECT_GE(codes.size(), 2u) << c.id << ": variants are identical";
  }
  EXPECT_GE(bug_catalogue().size(), 40u);
  EXPECT_NE(error_of([] { fill_slots("int ${NOPE};", {}); }).find("${NOPE}"), std::string::npos);
}

TEST(ReviewCorpus, ParsesDiagnosticsAndDiffHunks) {
  const std::string out =
      "/tmp/x/a.cc:3:5: warning: use nullptr [modernize-use-nullptr]\n  int* p = NULL;\n      ^\n"
      "/usr/include/b.h:9:1: note: expanded from macro\n"
      "/tmp/x/a.cc:7:1: warning: second [bugprone-x]\n"
      "/other/file.h:2:2: warning: not ours [bugprone-y]\n  junk\n";
  auto d = parse_diagnostics(out, "/tmp/x/a.cc", "/src/a.cc", "clang-tidy");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].line, 3);
  EXPECT_EQ(d[0].text,
            "/src/a.cc:3:5: warning: use nullptr [modernize-use-nullptr]\n  int* p = NULL;\n      ^\n"
            "/usr/include/b.h:9:1: note: expanded from macro\n");
  EXPECT_EQ(d[1].line, 7);
  EXPECT_EQ(d[1].text.find("not ours"), std::string::npos);
  auto h = parse_unified_diff("--- a\n+++ b\n@@ -3,2 +3,2 @@\n a\n-b\n+c\n@@ -40 +40 @@ ctx\n-x\n+y\n");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].old_start, 3);
  EXPECT_EQ(h[0].old_count, 2);
  EXPECT_EQ(h[0].text, "@@ -3,2 +3,2 @@\n a\n-b\n+c\n");
  EXPECT_EQ(h[1].old_start, 40);
  EXPECT_EQ(h[1].old_count, 1);
}

TEST(ReviewCorpus, ClangTidyDiagnosticsAndFixOnAPlantedFile) {
  const std::string dir = fresh_dir("r");
  std::string code =
      "#include <cstddef>\n#include <vector>\n\nint first(const std::vector<int>& v) {\n"
      "  const int* p = NULL;\n  if (v.size() == 0) return 0;\n  p = &v[0];\n  return *p;\n}\n";
  for (int i = 0; i < 30; ++i)
    code += "int filler" + std::to_string(i) + "(int x) { return x + " + std::to_string(i) + "; }\n";
  code +=
      "struct Base {\n  virtual ~Base() = default;\n  virtual int f() const { return 1; }\n};\n"
      "struct Derived : Base {\n  virtual int f() const { return 2; }\n};\n";
  write_file(dir + "/src/planted.cc", code);
  ReviewOptions o;
  o.work_dir = dir;
  ReviewStats st;
  auto docs = review_file(dir + "/src/planted.cc", {dir + "/src", "plantedpkg", {}, {}}, o, &st);
  EXPECT_EQ(read_file(dir + "/src/planted.cc"), code) << "the reviewed file was modified";
  ASSERT_EQ(docs.size(), 2u) << "two far-apart groups of findings make two excerpts";
  const int null_line = line_of(code, "= NULL"), size_line = line_of(code, "v.size() == 0"),
            override_line = line_of(code, "virtual int f() const { return 2; }");
  const std::string path = dir + "/src/planted.cc";
  const std::string& a = docs[0].text;
  EXPECT_NE(a.find(path + ":" + std::to_string(null_line) + ":"), std::string::npos) << a;
  EXPECT_NE(a.find("[modernize-use-nullptr]"), std::string::npos) << a;
  EXPECT_NE(a.find(path + ":" + std::to_string(size_line) + ":"), std::string::npos) << a;
  EXPECT_NE(a.find("[readability-container-size-empty]"), std::string::npos) << a;
  EXPECT_NE(a.find("\n-  const int* p = NULL;\n"), std::string::npos) << a;
  EXPECT_NE(a.find("\n+  const int* p = nullptr;\n"), std::string::npos) << a;
  EXPECT_NE(a.find("+  if (v.empty()) return 0;"), std::string::npos) << a;
  EXPECT_EQ(a.find("[modernize-use-override]"), std::string::npos) << "a finding of the other excerpt";
  const std::string& b = docs[1].text;
  EXPECT_NE(b.find(path + ":" + std::to_string(override_line) + ":"), std::string::npos) << b;
  EXPECT_NE(b.find("[modernize-use-override]"), std::string::npos) << b;
  EXPECT_NE(b.find("+  int f() const override { return 2; }"), std::string::npos) << b;
  // The excerpt shows the numbered lines it talks about.
  EXPECT_NE(a.find(std::to_string(null_line) + " |   const int* p = NULL;"), std::string::npos) << a;
  for (const auto& d : docs) {
    EXPECT_EQ(d.meta.domain, "review");
    EXPECT_EQ(d.meta.package, "plantedpkg");
    EXPECT_EQ(d.split_key, docs[0].split_key) << "excerpts of one file share a split";
    EXPECT_TRUE(d.extra["has_fix"].get<bool>());
  }
  EXPECT_EQ(st.files_reviewed, 1u);
  EXPECT_EQ(st.documents, 2u);
}

TEST(DocText, HtmlBecomesTextWithoutMarkup) {
  const std::string html =
      "<!DOCTYPE html><html><head><title>T</title><style>p { color: red; }</style></head><body>\n"
      "<script>var x = '<p>';</script><h1>std::sort</h1><p>Sorts the   range\n[first, last) in &lt;em&gt; "
      "<b>non-descending</b>&nbsp;order &amp; is O(N&middot;log N).</p>\n<!-- a comment -->"
      "<pre>std::vector&lt;int&gt; v{3, 1};\n  std::sort(v.begin(), v.end());</pre>"
      "<ul><li>first</li><li>second &#8212; &#x41;</li></ul><table><tr><td>a</td><td>b</td></tr></table></body></html>";
  const std::string text = html_to_text(html);
  EXPECT_EQ(
      text,
      "std::sort\n\nSorts the range [first, last) in <em> non-descending order & is O(N\xc2\xb7log N).\n\n"
      "std::vector<int> v{3, 1};\n  std::sort(v.begin(), v.end());\n\n- first\n- second \xe2\x80\x94 A\n\na  b\n");
  // Decoded "<em>" is text, but leftover_markup sees a tag name: the check is about tags as they look.
  EXPECT_EQ(leftover_markup(html_to_text("<p>x &amp;&amp; y</p><pre>a &lt; b</pre>")), "");
  EXPECT_EQ(leftover_markup("text <p class=\"x\"> more"), "<p class=\"x\">");
  EXPECT_EQ(leftover_markup("use \\fBbold\\fR here"), "\\fB");
  EXPECT_EQ(leftover_markup("a\n.SH NAME\nb"), "\n.SH ");
  EXPECT_EQ(leftover_markup("a &amp; b"), "&amp;");
  EXPECT_EQ(leftover_markup("std::vector<int> v; if (a < b && c > d) {}"), "");
}

TEST(DocText, ManPageRendersWithoutRoff) {
  if (!program_available("groff")) GTEST_FAIL() << "groff is needed (scripts/setup.sh installs groff-base)";
  const std::string dir = fresh_dir("m");
  write_file(dir + "/frob.1",
             ".TH FROB 1 \"2026-11-21\" \"slm\" \"User Commands\"\n.SH NAME\nfrob \\- frobnicate the input\n"
             ".SH SYNOPSIS\n\\fBfrob\\fR [\\fIOPTION\\fR]... \\fIFILE\\fR\n.SH OPTIONS\n.TP\n\\fB\\-v\\fR, "
             "\\fB\\-\\-verbose\\fR\nprint every step \\(em twice.\n.PP\nSee also\n.BR ls (1).\n");
  const std::string text = man_to_text(dir + "/frob.1");
  EXPECT_EQ(leftover_markup(text), "") << text;
  EXPECT_EQ(text.find('\b'), std::string::npos);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  for (const char* want : {"NAME", "frob - frobnicate the input", "frob [OPTION]... FILE", "-v, --verbose",
                           "print every step \xe2\x80\x94 twice.", "ls(1)"})
    EXPECT_NE(text.find(want), std::string::npos) << want << " missing in:\n" << text;
  // An alias page (.so) has no text of its own; gzip'd pages render like plain ones.
  write_file(dir + "/alias.1", ".so man1/frob.1\n");
  EXPECT_EQ(man_to_text(dir + "/alias.1"), "");
  ASSERT_EQ(std::system(("gzip -k '" + dir + "/frob.1'").c_str()), 0);
  EXPECT_EQ(man_to_text(dir + "/frob.1.gz"), text);
  EXPECT_EQ(document_text(dir + "/frob.1.gz", "man"), text);
}

TEST(DocText, StripOverstrike) {
  EXPECT_EQ(strip_overstrike("N\bNA\bAM\bME\bE _\bf_\bi_\bl_\be \x1b[1mbold\x1b[0m"), "NAME file bold");
  EXPECT_EQ(strip_overstrike("\xc3\xa9\b\xc3\xa9"), "\xc3\xa9");
}

TEST(AlgorithmCorpus, RuleSendsAlgorithmFilesToAlgorithmOnly) {
  EXPECT_TRUE(domain_accepts("algorithm", "/usr/include/c++/12/bits/stl_algo.h", ""));
  EXPECT_TRUE(domain_accepts("algorithm", "/usr/include/c++/12/parallel/algorithm", ""));
  EXPECT_TRUE(domain_accepts("algorithm", "/usr/include/boost/graph/dijkstra_shortest_paths.hpp", ""));
  EXPECT_TRUE(domain_accepts("algorithm", "/usr/share/cppreference/doc/html/en/cpp/algorithm/sort.html", ""));
  EXPECT_FALSE(domain_accepts("algorithm", "/usr/include/c++/12/bits/stl_vector.h", ""));
  EXPECT_FALSE(domain_accepts("algorithm", "/usr/include/boost/graph/figure.png", ""));
  EXPECT_FALSE(domain_accepts("design", "/usr/share/doc/pkg/changelog.Debian.gz", ""));
  EXPECT_TRUE(domain_accepts("design", "/usr/share/doc/pkg/README.md", ""));

  // A planted tree seen by both domains: each file lands in exactly one.
  const std::string dir = fresh_dir("a");
  const std::string src = dir + "/c++/12";
  write_file(src + "/bits/stl_algo.h", random_code(11));
  write_file(src + "/bits/stl_vector.h", random_code(12));
  write_file(src + "/parallel/algorithm", random_code(13));
  CorpusOptions o;
  o.domains = {"cpp", "algorithm"};
  o.out_dir = dir + "/out";
  o.roots["cpp"] = {{src, "libstdc++-12-dev", "GPL-3+", true, algorithm_paths(), ""}};
  o.roots["algorithm"] = {{src, "libstdc++-12-dev", "GPL-3+", false, {}, ""}};
  o.validation_fraction = o.test_fraction = 0;
  o.dpkg_info_dir = dir + "/none";
  auto rep = build_corpus(o);
  auto cpp = read_jsonl(o.out_dir + "/cpp/train.jsonl");
  auto alg = read_jsonl(o.out_dir + "/algorithm/train.jsonl");
  ASSERT_EQ(cpp.size(), 1u);
  EXPECT_EQ(cpp[0]["path"].get<std::string>(), src + "/bits/stl_vector.h");
  ASSERT_EQ(alg.size(), 2u);
  EXPECT_EQ(rep.domains[1].cross_domain_dups, 0u);
  // The built-in cpp roots exclude every algorithm path.
  for (const auto& r : default_roots("cpp"))
    for (const auto& p : algorithm_paths())
      EXPECT_NE(std::find(r.exclude.begin(), r.exclude.end(), p), r.exclude.end()) << r.path << " takes " << p;
}

class RouterCorpus : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fresh_dir("o");
    for (int i = 0; i < 40; ++i) write_file(dir + "/src/cpp/f" + std::to_string(i) + ".cpp", random_code(300 + i, 30));
    for (int i = 0; i < 12; ++i)
      write_file(dir + "/src/cmake/m" + std::to_string(i) + "/CMakeLists.txt",
                 "cmake_minimum_required(VERSION 3.25)\nproject(p" + std::to_string(i) + " CXX)\n" + "add_library(lib" +
                     std::to_string(i) + " STATIC a.cpp b.cpp)\ntarget_compile_features(lib" + std::to_string(i) +
                     " PUBLIC cxx_std_20)\n# " + random_code(i, 2));
    for (int i = 0; i < 12; ++i)
      write_file(dir + "/src/shell/s" + std::to_string(i) + ".sh",
                 "#!/bin/sh\nset -eu\n# step " + std::to_string(i) +
                     "\nfor f in \"$@\"; do\n  echo \"$f\" | wc -c\ndone\n# " + random_code(100 + i, 2));
    o.domains = {"cpp", "cmake", "shell", "orchestration"};
    o.out_dir = dir + "/out";
    o.roots["cpp"] = {{dir + "/src/cpp", "pkg-cpp", "MIT", false, {}, ""}};
    o.roots["cmake"] = {{dir + "/src/cmake", "pkg-cmake", "MIT", false, {}, ""}};
    o.roots["shell"] = {{dir + "/src/shell", "pkg-shell", "MIT", false, {}, ""}};
    o.validation_fraction = 0.25;
    o.test_fraction = 0.25;
    o.dpkg_info_dir = dir + "/none";
    o.router.max_windows_per_doc = 3;
    o.router.min_window = 120;
  }
  std::string dir;
  CorpusOptions o;
};

// The split hashes a file's path below its root: the same sources in another directory split alike. (The absolute
// path put the files of one corpus in other splits on every machine, and gave this fixture, whose directory name holds
// the process id, a different split on every run.)
TEST_F(RouterCorpus, TheSameSourcesSplitAlikeWhereverTheyLie) {
  o.domains = {"cpp", "cmake", "shell"};
  auto splits = [](const CorpusOptions& opts, const std::string& src) {
    std::map<std::string, std::string> out;  // path below src -> split
    for (const char* d : {"cpp", "cmake", "shell"})
      for (const char* sp : {"train", "validation", "test"})
        for (const auto& j : read_jsonl(opts.out_dir + "/" + d + "/" + sp + ".jsonl"))
          out[j["path"].get<std::string>().substr(src.size())] = sp;
    return out;
  };
  build_corpus(o);
  const auto here = splits(o, dir + "/src");
  const std::string elsewhere = fresh_dir("a-longer-name-for-another-place");
  ASSERT_EQ(::rename((dir + "/src").c_str(), (elsewhere + "/src").c_str()), 0);
  CorpusOptions moved = o;
  moved.out_dir = elsewhere + "/out";
  for (auto& [domain, roots] : moved.roots)
    for (auto& r : roots) r.path = elsewhere + r.path.substr(dir.size());
  build_corpus(moved);
  EXPECT_EQ(here.size(), 64u);  // 40 C++ files, 12 CMake lists, 12 scripts
  EXPECT_EQ(splits(moved, elsewhere + "/src"), here);
}

TEST_F(RouterCorpus, RequestsAreLabelledBalancedAndSplitLikeTheirSources) {
  auto rep = build_corpus(o);
  std::map<std::string, std::pair<std::string, std::string>> source;  // path -> (domain, split)
  std::map<std::string, std::string> text_of;
  for (const char* d : {"cpp", "cmake", "shell"})
    for (const char* sp : {"train", "validation", "test"})
      for (const auto& j : read_jsonl(o.out_dir + "/" + d + "/" + sp + ".jsonl")) {
        source[j["path"].get<std::string>()] = {d, sp};
        text_of[j["path"].get<std::string>()] = j["text"].get<std::string>();
      }
  std::map<std::string, std::map<std::string, int>> count;  // split -> label -> requests
  size_t total = 0;
  for (const char* sp : {"train", "validation", "test"})
    for (const auto& j : read_jsonl(o.out_dir + "/orchestration/" + sp + ".jsonl")) {
      ++total;
      const std::string path = j["path"].get<std::string>(), label = j["label"].get<std::string>();
      ASSERT_TRUE(source.count(path)) << path;
      EXPECT_EQ(label, source[path].first) << "label differs from the source document's domain";
      EXPECT_EQ(std::string(sp), source[path].second) << path << ": request and source in different splits";
      EXPECT_EQ(j["domain"].get<std::string>(), "orchestration");
      ++count[sp][label];
      // The request holds a window of its source: its longest line is a line of the source text.
      std::string longest, line;
      std::istringstream in(j["text"].get<std::string>());
      while (std::getline(in, line))
        if (line.size() > longest.size()) longest = line;
      EXPECT_NE(text_of[path].find(longest), std::string::npos) << longest;
    }
  ASSERT_GT(total, 0u);
  for (const auto& [sp, by_label] : count) {
    EXPECT_EQ(by_label.size(), 3u) << sp;
    const int n = by_label.begin()->second;
    for (const auto& [label, c] : by_label) EXPECT_EQ(c, n) << sp << ": " << label << " unbalanced";
  }
  EXPECT_EQ(rep.domains[3].documents, total);

  // Built alone, orchestration reads the other domains from out_dir and makes the same requests.
  const std::string first = read_file(o.out_dir + "/orchestration/train.jsonl");
  o.domains = {"orchestration"};
  build_corpus(o);
  EXPECT_EQ(read_file(o.out_dir + "/orchestration/train.jsonl"), first);
}

TEST(RouterRequests, BuiltAloneWithoutSourcesIsAnError) {
  CorpusOptions o;
  o.domains = {"orchestration"};
  o.out_dir = fresh_dir("e");
  EXPECT_NE(error_of([&] { build_corpus(o); }).find("orchestration needs the other domains"), std::string::npos);
}

TEST(RouterRequests, DebugRequestsUseTheToolOutputOrTheProgram) {
  RouterSource s;
  s.domain = "debug";
  s.split = "train";
  s.meta = {"p", "generated/debug/x/v0/f.cpp", "l", "debug"};
  s.text =
      "# t\n\n```cpp\nint main() { return 0; }\n```\n\n```console\n$ g++ f.cpp\n==1==ERROR: AddressSanitizer: "
      "heap-buffer-overflow\n```\n";
  RouterOptions ro;
  const std::string out = router_request(s, 0, ro), code = router_request(s, 1, ro);
  EXPECT_NE(out.find("AddressSanitizer: heap-buffer-overflow"), std::string::npos) << out;
  EXPECT_EQ(out.find("int main"), std::string::npos) << out;
  EXPECT_NE(code.find("int main() { return 0; }"), std::string::npos) << code;
  EXPECT_EQ(code.find("AddressSanitizer"), std::string::npos) << code;
}

// The sampler keeps, per split and domain, only the max_per_domain sources of lowest hash: the requests it makes
// are cut from exactly those (chosen here by sorting every source's hash), in hash order, and the quota follows the
// count offered, not the count kept.
TEST(RouterRequests, SamplerCutsFromTheLowestHashSourcesOnly) {
  RouterOptions ro;
  ro.max_per_domain = 3;
  ro.max_windows_per_doc = 2;
  std::vector<RouterSource> sources;
  std::vector<std::pair<uint64_t, std::string>> by_hash;
  for (int i = 0; i < 12; ++i) {
    RouterSource s;
    s.domain = i % 2 ? "cmake" : "shell";
    s.split = "train";
    s.meta = {"pkg" + std::to_string(i), "dir/file" + std::to_string(i), "MIT", s.domain};
    s.text = "line one of source " + std::to_string(i) + "\nline two\n";
    if (s.domain == "shell")
      by_hash.emplace_back(hash64(s.meta.package + "\n" + s.meta.path, 0x726f7574ULL), s.meta.path);
    sources.push_back(s);
  }
  std::sort(by_hash.begin(), by_hash.end());
  RouterSampler sampler(ro);
  for (const auto& s : sources) sampler.offer(s);
  std::vector<std::string> shell_paths;
  for (const auto& g : sampler.requests())
    if (g.extra["label"] == "shell") shell_paths.push_back(g.meta.path);
  // 6 shell sources offered: the quota is min(3, 6 * 2) = 3, met by window 0 of the 3 lowest-hash sources.
  ASSERT_EQ(shell_paths.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(shell_paths[i], by_hash[i].second);
}

// Without balance_train the train split keeps each domain's own capacity min(max_per_domain, documents x windows)
// (counted by hand below), while a held-out split is still cut to its smallest domain's.
TEST(RouterRequests, UnbalancedTrainKeepsEachDomainsCapacity) {
  RouterOptions ro;
  ro.max_per_domain = 5;
  ro.max_windows_per_doc = 2;
  ro.balance_train = false;
  std::vector<RouterSource> sources;
  auto add = [&](const std::string& domain, const std::string& split, int docs) {
    for (int i = 0; i < docs; ++i) {
      RouterSource s;
      s.domain = domain;
      s.split = split;
      s.meta = {"pkg", domain + split + std::to_string(i), "MIT", domain};
      s.text = "line one of " + s.meta.path + "\nline two\nline three\n";
      sources.push_back(s);
    }
  };
  add("cmake", "train", 1);  // 1 x 2 windows = 2
  add("shell", "train", 2);  // 2 x 2 = 4
  add("cpp", "train", 9);    // 18, capped at 5
  add("cmake", "validation", 1);
  add("shell", "validation", 3);
  std::map<std::string, int> count;
  for (const auto& g : make_router_requests(sources, ro)) ++count[g.split + "/" + g.extra["label"].get<std::string>()];
  EXPECT_EQ(
      count,
      (std::map<std::string, int>{
          {"train/cmake", 2}, {"train/shell", 4}, {"train/cpp", 5}, {"validation/cmake", 2}, {"validation/shell", 2}}));
  ro.balance_train = true;
  count.clear();
  for (const auto& g : make_router_requests(sources, ro)) ++count[g.split + "/" + g.extra["label"].get<std::string>()];
  EXPECT_EQ(count["train/cpp"], 2);
  EXPECT_EQ(count["train/shell"], 2);
}
