// Reading MultiPL-E problem files and ready completions: the real file, and clear errors on bad input.
#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "eval_test_util.h"
#include "slm/eval/completions.h"
#include "slm/eval/humaneval.h"

using namespace slm;
using namespace slm::test;

namespace {

const std::string kGood =
    R"({"name": "p1", "prompt": "#include <cstdio>\nint f() {\n", "tests": "}\nint main() { return f(); }\n", "stop_tokens": ["\n}"]})";

}  // namespace

TEST(HumanEvalProblems, ReadsTheMultiplEFile) {
  SLM_REQUIRE_HUMANEVAL();
  const auto problems = eval::load_problems(humaneval_file());
  ASSERT_EQ(problems.size(), 161u);  // the README's count
  EXPECT_EQ(problems[0].name, "HumanEval_0_has_close_elements");
  for (const auto& p : problems) {
    EXPECT_EQ(p.stop_tokens, std::vector<std::string>{"\n}"}) << p.name;
    EXPECT_EQ(p.tests.substr(0, 2), "}\n") << p.name;
    EXPECT_EQ(p.prompt.back(), '\n') << p.name;
  }
  EXPECT_EQ(eval::include_prelude(problems[0].prompt), "#include<assert.h>\n#include<bits/stdc++.h>\n");
}

TEST(HumanEvalProblems, BadLinesAreNamedByLineNumber) {
  EXPECT_EQ(eval::load_problems(write_temp("ok.jsonl", kGood + "\n\n")).size(), 1u);
  std::string m = error_of([] { eval::load_problems(write_temp("bad.jsonl", kGood + "\n{\"name\": \n")); });
  EXPECT_NE(m.find("bad.jsonl:2: not a JSON value"), std::string::npos) << m;
  m = error_of([] {
    // One literal: "\n" + std::string(...) trips GCC 12's -Wrestrict false positive in basic_string at -O3.
    eval::load_problems(write_temp("missing.jsonl", "\n{\"name\": \"p\", \"prompt\": \"x\", \"stop_tokens\": []}"));
  });
  EXPECT_NE(m.find("missing.jsonl:2: the problem has no \"tests\" field"), std::string::npos) << m;
  m = error_of([] { eval::load_problems(write_temp("dup.jsonl", kGood + "\n" + kGood + "\n")); });
  EXPECT_NE(m.find("dup.jsonl:2: problem \"p1\" appears twice"), std::string::npos) << m;
  m = error_of([] {
    eval::load_problems(
        write_temp("stops.jsonl", R"({"name": "p", "prompt": "x", "tests": "y", "stop_tokens": "\n}"})"));
  });
  EXPECT_NE(m.find("stops.jsonl:1: \"stop_tokens\" must be an array"), std::string::npos) << m;
  m = error_of([] { eval::load_problems("/nonexistent/problems.jsonl"); });
  EXPECT_NE(m.find("/nonexistent/problems.jsonl: cannot read"), std::string::npos) << m;
}

TEST(HumanEvalProblems, CompletionsFileGroupsSamplesAndRejectsUnknownTasks) {
  const auto problems = eval::load_problems(write_temp("one.jsonl", kGood));
  eval::CompletionsFile f(write_temp("c.jsonl", R"({"task_id": "p1", "completion": "a"}
{"name": "p1", "completion": "b", "extra": 1}
)"),
                          problems);
  EXPECT_EQ(f.count(problems[0], 7), 2);
  EXPECT_EQ(f.complete(problems[0], 7), (std::vector<eval::Completion>{{"a", ""}, {"b", ""}}));
  std::string m = error_of([&] {
    eval::CompletionsFile(write_temp("u.jsonl", R"({"task_id": "p1", "completion": "a"}
{"task_id": "p9", "completion": "b"})"),
                          problems);
  });
  EXPECT_NE(m.find("u.jsonl:2: task \"p9\" is not in the problem file"), std::string::npos) << m;
  m = error_of([&] { eval::CompletionsFile(write_temp("nc.jsonl", R"({"task_id": "p1"})"), problems); });
  EXPECT_NE(m.find("nc.jsonl:1: needs a string \"completion\""), std::string::npos) << m;
}
