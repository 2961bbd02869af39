// Context adherence and hallucination (eval/context_adherence.h): the score of hand-written completions, the cases of
// a planted source tree (callees and callers in the prompt, the target's head last), and a run over planted
// completions whose counts are worked out by hand, with identifiers known through the file's own includes.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <set>

#include "data/data_test_util.h"
#include "eval/eval_test_util.h"
#include "slm/eval/context_adherence.h"

namespace slm {
namespace {

using Strings = std::vector<std::string>;

TEST(ContextAdherence, ScoresCallsDeclarationsAndUnknownIdentifiers) {
  const std::set<std::string> known = {"a", "b", "x", "std", "max", "helper_sum"};
  auto in = [&](const std::string& w) { return known.count(w) > 0; };
  const auto s = eval::score_adherence(
      "  int total = helper_sum(a, b);  // frobnicate(a) in a comment\n"
      "  auto v = std::max(total, frobnicate(x));\n  const char* why = \"undefined_name(\";\n  return v;\n",
      {"helper_sum"}, in);
  EXPECT_TRUE(s.calls_callee);
  // total, v and why are declared by the completion; int, auto, const, char, return are keywords.
  EXPECT_EQ(s.identifiers, (Strings{"a", "b", "frobnicate", "helper_sum", "max", "std", "x"}));
  EXPECT_EQ(s.unknown, (Strings{"frobnicate"}));

  EXPECT_TRUE(eval::score_adherence("  return convert<std::vector<int>>(s);\n", {"convert"}, in).calls_callee);
  EXPECT_TRUE(eval::score_adherence("  return obj->convert (s);\n", {"convert"}, in).calls_callee);
  EXPECT_FALSE(eval::score_adherence("  return convert_all(s);\n", {"convert"}, in).calls_callee);
  EXPECT_FALSE(eval::score_adherence("  auto f = convert;\n", {"convert"}, in).calls_callee);  // named, not called
  EXPECT_FALSE(eval::score_adherence("  // convert(s)\n  return R\"x(convert(s))x\";\n", {"convert"}, in).calls_callee);
  // `return y;` uses y (a statement keyword before it is no type), `new Widget(` uses Widget.
  const auto t = eval::score_adherence("  return y;\n  p = new Widget(3);\n#define Q zzz\n", {}, in);
  EXPECT_EQ(t.identifiers, (Strings{"Widget", "p", "y"}));
  EXPECT_EQ(eval::cpp_identifiers("a.b->c::d 0x1f 1'000 'q' \"s\" e"), (Strings{"a", "b", "c", "d", "e"}));
}

// util.cpp: add (no callee), twice (calls add; called by use), use (calls twice and helper_from_header).
void plant_tree(const std::string& root) {
  ::mkdir(root.c_str(), 0755);
  test::write_file(root + "/extra.h", "#pragma once\nint helper_from_header();\n");
  test::write_file(root + "/util.cpp",
                   "#include <vector>\n#include \"extra.h\"\n\nint add(int a, int b) {\n  int s = a + b;\n  return s;\n"
                   "}\n\nint twice(int x) {\n  int y = add(x, x);\n  return y;\n}\n\nint use() {\n  int r = twice(2);\n"
                   "  return r + helper_from_header();\n}\n");
}

TEST(ContextAdherence, CasesShowCalleesThenCallersThenTheTargetsHead) {
  const std::string root = test::fresh_dir("context_cases");
  plant_tree(root);
  const auto cases = eval::make_context_cases(root);
  ASSERT_EQ(cases.size(), 2u);  // add calls nothing
  const auto& t = cases[0].problem.name.find("twice") != std::string::npos ? cases[0] : cases[1];
  EXPECT_EQ(t.problem.name, "util.cpp:9:twice");
  EXPECT_EQ(t.callees, (Strings{"add"}));
  EXPECT_EQ(t.callers, 1u);
  EXPECT_EQ(t.body, "  int y = add(x, x);\n  return y;");
  EXPECT_EQ(t.problem.stop_tokens, (Strings{"\n}"}));
  const std::string& p = t.problem.prompt;
  EXPECT_EQ(p.rfind("#include <vector>\n#include \"extra.h\"\n\n// util.cpp:4\nint add(int a, int b) {", 0), 0u) << p;
  const size_t caller = p.find("// util.cpp:14\nint use() {");
  ASSERT_NE(caller, std::string::npos) << p;
  EXPECT_GT(caller, p.find("int add("));
  const std::string head = "}\n\n// util.cpp:9\nint twice(int x) {\n";  // the caller's end, then the target
  EXPECT_EQ(p.substr(p.size() - head.size()), head) << p;
  EXPECT_EQ(p.find("int y = add"), std::string::npos) << "the body leaked into the prompt\n" << p;
  // Too little room for any callee: no case.
  eval::ContextCaseOptions tight;
  tight.max_prompt_bytes = 60;  // the #include lines and either head take more
  EXPECT_TRUE(eval::make_context_cases(root, tight).empty());
  EXPECT_THROW(eval::make_context_cases(root + "/missing"), Error);
}

TEST(PromptTail, KeepsWholeLinesWithinTheBudget) {
  const std::string p = "line one\nline two\nthree\n";  // 9 + 9 + 6 bytes
  EXPECT_EQ(eval::prompt_tail(p, 0), p);
  EXPECT_EQ(eval::prompt_tail(p, 24), p);
  EXPECT_EQ(eval::prompt_tail(p, 15), "line two\nthree\n");  // starts exactly at a line
  EXPECT_EQ(eval::prompt_tail(p, 14), "three\n");            // mid-line: from the next line
  EXPECT_EQ(eval::prompt_tail(p, 3), "ee\n");                // no line start inside: the last bytes
}

TEST(ContextAdherence, PlantedCompletionsCountedByHand) {
  const std::string root = test::fresh_dir("context_run");
  plant_tree(root);
  const auto cases = eval::make_context_cases(root);
  std::vector<eval::Problem> problems;
  for (const auto& c : cases) problems.push_back(c.problem);
  auto line = [](const std::string& task, const std::string& completion) {
    return nlohmann::json{{"task_id", task}, {"completion", completion}}.dump() + "\n";
  };
  // twice: one sample calls add (and std::vector's push_back, known from <vector>), one does not.
  // use: calls twice; helper_from_header is known only through extra.h, undefined_thing nowhere.
  const std::string file = test::write_temp(
      "context.jsonl",
      line("util.cpp:9:twice", "  std::vector<int> v;\n  v.push_back(add(x, x));\n  return v.back();\n}\nint junk;") +
          line("util.cpp:9:twice", "  return x + x;\n}") +
          line("util.cpp:14:use", "  return twice(1) + undefined_thing(2) + helper_from_header();\n}"));
  eval::CompletionsFile source(file, problems);
  eval::KnownIdentifiers known("g++", "c++17", {});
  const std::string results = root + "/results.jsonl";
  const auto r = eval::run_context_adherence(cases, source, 1, known, root, results);
  EXPECT_EQ(r.cases, 2u);
  EXPECT_EQ(r.completions, 3u);
  EXPECT_EQ(r.adhering, 2u);
  // Identifiers: {std, vector, push_back, add, x, back} + {x} + {twice, undefined_thing, helper_from_header}; junk is
  // after the stop sequence.
  EXPECT_EQ(r.identifiers, 10u);
  EXPECT_EQ(r.unknown, 1u);
  EXPECT_EQ(r.with_unknown, 1u);
  EXPECT_DOUBLE_EQ(r.hallucination_rate(), 0.1);
  const std::string out = test::read_file(results);
  EXPECT_NE(out.find("\"unknown\":[\"undefined_thing\"]"), std::string::npos) << out;
  EXPECT_EQ(r.json()["adhering"], 2);
}

}  // namespace
}  // namespace slm
