// Compile-pass (eval/compile_pass.h): cuts that reassemble their file, the syntax-only judge with the file's own
// directory on the quote path, the control that drops files which do not compile on their own, and the CLI.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "eval/eval_test_util.h"
#include "slm/eval/compile_pass.h"

namespace slm {
namespace {

const char* kFile = R"(#include <string>
#include "local.h"

// Adds.
int add(int a, int b) {
  int s = a + b;
  return s;
}

int one() { return 1; }

struct Shape {
  int sides() const {
    const char* brace = "}{";
    (void)brace;
    return 4 + local_value();
  }
  Shape() = default;
};

namespace geo {
template <class T>
T twice(T x)
{
  T y = x;
  return y + y;
}
}  // namespace geo
)";

// A directory with the planted file, its local header and (optionally) a file that cannot compile here.
std::string planted_tree(bool with_broken) {
  const std::string dir = testing::TempDir() + "/" + std::to_string(getpid()) + "_cp" + (with_broken ? "b" : "");
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/shapes.cpp") << kFile;
  std::ofstream(dir + "/local.h") << "#pragma once\ninline int local_value() { return 0; }\n";
  if (with_broken)
    std::ofstream(dir + "/broken.cpp")
        << "#include <no_such_header.h>\n\nint f(int x) {\n  int y = x;\n  return y;\n}\n";
  return dir;
}

eval::Isolation best_isolation() {
  return eval::Sandbox::probe().empty() ? eval::Isolation::kNamespaces : eval::Isolation::kNone;
}

eval::CompileOptions syntax_only() {
  eval::CompileOptions c;
  c.pch = false;
  c.syntax_only = true;
  c.standard = "c++20";
  return c;
}

TEST(CompilePassCuts, EveryCutReassemblesItsFile) {
  eval::BodyCutOptions o;
  o.max_per_file = 10;
  const auto cuts = eval::cut_function_bodies("shapes.cpp", kFile, "/src", o);
  // one() is on one line and Shape() has no body: neither can be cut.
  ASSERT_EQ(cuts.size(), 3u);
  EXPECT_EQ(cuts[0].problem.name, "shapes.cpp:4:add");  // the leading comment's line
  EXPECT_EQ(cuts[0].body, "  int s = a + b;\n  return s;");
  EXPECT_EQ(cuts[0].problem.stop_tokens, std::vector<std::string>{"\n}"});
  EXPECT_EQ(cuts[1].problem.name, "shapes.cpp:13:Shape::sides");
  EXPECT_EQ(cuts[1].problem.stop_tokens, std::vector<std::string>{"\n  }"});
  EXPECT_EQ(cuts[1].body, "    const char* brace = \"}{\";\n    (void)brace;\n    return 4 + local_value();");
  EXPECT_EQ(cuts[2].problem.name, "shapes.cpp:22:geo::twice");  // the template header's line
  for (const auto& c : cuts) {
    EXPECT_EQ(eval::program_text(c.problem, c.body), kFile) << c.problem.name;
    EXPECT_EQ(c.problem.quote_dirs, std::vector<std::string>{"/src"});
  }
  o.max_per_file = 2;
  const auto two = eval::cut_function_bodies("shapes.cpp", kFile, "", o);
  ASSERT_EQ(two.size(), 2u);
  auto index = [&](const eval::BodyCut& c) {
    for (size_t i = 0; i < cuts.size(); ++i)
      if (cuts[i].problem.name == c.problem.name) return i;
    return cuts.size();
  };
  EXPECT_LT(index(two[0]), index(two[1]));  // two of the three, in file order
  EXPECT_LT(index(two[1]), cuts.size());
  o.min_body_lines = 3;
  EXPECT_EQ(eval::cut_function_bodies("shapes.cpp", kFile, "", o).size(), 1u);  // only sides() has 3 lines
}

TEST(CompilePassJudge, TheOriginalBodyCompilesAndAWrongOneDoesNot) {
  const std::string dir = planted_tree(false);
  eval::BodyCutOptions o;
  o.max_per_file = 10;
  const auto cuts = eval::cut_function_bodies("shapes.cpp", kFile, dir, o);
  ASSERT_EQ(cuts.size(), 3u);
  eval::Judge judge(syntax_only(), {}, best_isolation());
  // local_value() comes from "local.h" beside the file: the quote path finds it.
  EXPECT_EQ(judge.judge(cuts[1].problem, cuts[1].body).outcome, eval::Outcome::kPassed);
  const auto wrong = judge.judge(cuts[1].problem, "    return undefined_name;");
  EXPECT_EQ(wrong.outcome, eval::Outcome::kCompileError);
  EXPECT_NE(wrong.stderr_head.find("undefined_name"), std::string::npos) << wrong.stderr_head;
  // A completion that runs past the body is cut at the closing line, as the harness cuts every completion.
  EXPECT_EQ(judge.judge(cuts[0].problem, "  return a - b;\n}\n\nint extra() {").outcome, eval::Outcome::kPassed);
}

TEST(CompilePassJudge, TheControlDropsFilesThatDoNotCompileOnTheirOwn) {
  const std::string dir = planted_tree(true);
  auto cuts = eval::cut_source_tree(dir, 0);
  ASSERT_EQ(cuts.size(), 3u);  // broken.cpp's f, and two of shapes.cpp's three (max_per_file 2)
  eval::Judge judge(syntax_only(), {}, best_isolation());
  const auto kept = eval::keep_compiling(cuts, judge, 2);
  ASSERT_EQ(kept.size(), 2u);
  for (const auto& c : kept) EXPECT_EQ(c.problem.name.rfind("shapes.cpp:", 0), 0u) << c.problem.name;
  EXPECT_THROW(eval::cut_source_tree(dir + "/nope", 0), Error);
}

TEST(CompilePassCli, ScoresPlantedCompletions) {
  const std::string dir = planted_tree(false);
  const std::string completions =
      test::write_temp("cp.jsonl", R"({"task_id": "shapes.cpp:4:add", "completion": "  return a * b;\n}"}
{"task_id": "shapes.cpp:13:Shape::sides", "completion": "    return nope;"}
)");
  auto r = test::run_slm("eval compile-pass --files " + dir + " --cuts-per-file 3 --completions " + completions +
                         " --jobs 1 --json --out ''");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t begin = r.out.find("{\n"), end = r.out.rfind("\n}");
  ASSERT_NE(begin, std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(begin, end + 2 - begin));
  EXPECT_DOUBLE_EQ(j["pass_at_k"]["1"].get<double>(), 0.5);
  EXPECT_EQ(j["samples"], 2);
  EXPECT_NE(r.out.find("3 function bodies cut"), std::string::npos) << r.out;
  r = test::run_slm("eval compile-pass --files /nonexistent --completions " + completions);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent is not a directory"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace slm
