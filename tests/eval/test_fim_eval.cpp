// slm eval fim (src/slm/eval/fim_eval.h): the cases cut from a hand-written file, the metrics against hand-computed
// values, the copy-line-above baseline, the context chunks, and the command end to end with a tiny random model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "eval_test_util.h"
#include "slm/eval/fim_eval.h"
#include "slm/util/files.h"

namespace slm::eval {
namespace {

// Line numbers on the right; the byte offsets of the line starts used below are counted by hand:
// line 1 "#include <string>\n" (18 bytes), line 2 "// a comment line\n" (18), so line 3 starts at 36; line 3 has
// 24 bytes, so line 4 starts at 60 and its cursor (after two spaces) is at 62; line 4 has 17 bytes with its '\n'.
const char* kFile =
    "#include <string>\n"                // 1  code
    "// a comment line\n"                // 2  comment only
    "int add(int a, int b) {\n"          // 3  code
    "  int s = a + b;\n"                 // 4  code
    "  return s;\n"                      // 5  code
    "}\n"                                // 6  too short
    "\n"                                 // 7  blank
    "/* block\n"                         // 8  comment only
    "   comment */\n"                    // 9  inside the comment
    "int f() { return 1; }\n"            // 10 code
    "std::string g() {\n"                // 11 code
    "  const char* s = \"}{\";  // }\n"  // 12 code
    "  /* { */\n"                        // 13 comment only
    "  return s;\n"                      // 14 code
    "}\n";                               // 15 too short

TEST(FimCases, LineCasesSkipBlankCommentAndShortLines) {
  const std::string text = kFile;
  const auto cases = line_cases("x.cpp", text, 7, 4);
  std::vector<size_t> lines;
  std::vector<std::string> truths;
  for (const auto& c : cases) {
    lines.push_back(c.line);
    truths.push_back(c.truth);
    EXPECT_EQ(c.file, 7u);
    EXPECT_EQ(c.kind, FimKind::kLine);
  }
  EXPECT_EQ(lines, (std::vector<size_t>{1, 3, 4, 5, 10, 11, 12, 14}));
  EXPECT_EQ(truths, (std::vector<std::string>{"#include <string>", "int add(int a, int b) {", "int s = a + b;",
                                              "return s;", "int f() { return 1; }", "std::string g() {",
                                              "const char* s = \"}{\";  // }", "return s;"}));
  ASSERT_EQ(cases.size(), 8u);
  EXPECT_EQ(cases[0].cursor, 0u);
  EXPECT_EQ(cases[1].cursor, 36u);
  const auto& c = cases[2];  // line 4
  EXPECT_EQ(c.cursor, 62u);
  EXPECT_EQ(c.prefix, "#include <string>\n// a comment line\nint add(int a, int b) {\n");
  EXPECT_EQ(c.prompt, "  ");
  EXPECT_EQ(c.suffix, text.substr(76));
  EXPECT_EQ(c.suffix.substr(0, 13), "\n  return s;\n");
  EXPECT_EQ(c.name, "x.cpp:4");
  // A higher minimum drops the 9-character "return s;" lines.
  EXPECT_EQ(line_cases("x.cpp", text, 0, 10).size(), 6u);
}

TEST(FimCases, BodyCasesMatchBracesPastStringsAndComments) {
  const auto cases = body_cases("x.cpp", kFile, 0, BodyCutOptions{5, 2, 2000}, "");
  ASSERT_EQ(cases.size(), 2u);  // f()'s one-line body is no case
  EXPECT_EQ(cases[0].line, 4u);
  EXPECT_EQ(cases[0].truth, "  int s = a + b;\n  return s;");
  EXPECT_EQ(cases[0].prefix, "#include <string>\n// a comment line\nint add(int a, int b) {\n");
  EXPECT_EQ(cases[0].prompt, "");
  EXPECT_EQ(cases[0].suffix.substr(0, 3), "\n}\n");
  // The "}{" in the string, the } in the line comment and the { in the block comment do not end the body.
  EXPECT_EQ(cases[1].line, 12u);
  EXPECT_EQ(cases[1].truth, "  const char* s = \"}{\";  // }\n  /* { */\n  return s;");
  EXPECT_EQ(cases[1].suffix, "\n}\n");
  // The file again from the compiler's pieces.
  EXPECT_EQ(program_text(cases[1].problem, cases[1].truth), kFile);
}

TEST(FimCases, CapsAreDeterministicAndOrdered) {
  std::vector<HeldOutFile> files = {{"p", "a.cpp", kFile}, {"p", "b.cpp", kFile}};
  FimCaseOptions o;
  o.line_cases = 3;
  o.lines_per_file = 2;
  o.body_cases = 1;
  o.seed = 5;
  const auto a = make_fim_cases(files, o), b = make_fim_cases(files, o);
  ASSERT_EQ(a.size(), 4u);
  size_t lines = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    lines += a[i].kind == FimKind::kLine;
    if (i > 0) {
      EXPECT_LE(std::tie(a[i - 1].file, a[i - 1].line), std::tie(a[i].file, a[i].line));
    }
  }
  EXPECT_EQ(lines, 3u);
}

TEST(FimMetrics, LevenshteinHandValues) {
  EXPECT_EQ(levenshtein("kitten", "sitting"), 3u);
  EXPECT_EQ(levenshtein("flaw", "lawn"), 2u);
  EXPECT_EQ(levenshtein("", "abc"), 3u);
  EXPECT_EQ(levenshtein("abc", ""), 3u);
  EXPECT_EQ(levenshtein("abc", "abc"), 0u);
  // Over code points: "ä" is two bytes, one character.
  EXPECT_EQ(levenshtein("\xc3\xa4", "a"), 1u);
  EXPECT_EQ(levenshtein("\xe6\x97\xa5\xe6\x9c\xac", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"), 1u);  // 日本 / 日本語
  // An invalid byte is one unit of its own.
  EXPECT_EQ(levenshtein("a\xff", "a"), 1u);
}

TEST(FimMetrics, EditSimilarityHandValues) {
  EXPECT_DOUBLE_EQ(edit_similarity("kitten", "sitting"), 1.0 - 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(edit_similarity("abcd", "abce"), 0.75);
  EXPECT_DOUBLE_EQ(edit_similarity("", ""), 1.0);
  EXPECT_DOUBLE_EQ(edit_similarity("", "xy"), 0.0);
  EXPECT_DOUBLE_EQ(edit_similarity("\xc3\xa4", "a"), 0.0);  // one substitution over one character
}

TEST(FimMetrics, ExactMatchOfTheFirstLineIgnoresTrailingWhitespaceOnly) {
  EXPECT_TRUE(first_line_match("return s;  \nfoo();", "return s;"));
  EXPECT_TRUE(first_line_match("x\t", "x\r"));
  EXPECT_TRUE(first_line_match("  int a;\n  b();", "  int a;\n  c();"));  // only the first line counts
  EXPECT_FALSE(first_line_match("return s", "return s;"));
  EXPECT_FALSE(first_line_match("  x", "x"));  // leading whitespace is part of the text
  EXPECT_FALSE(first_line_match("", "x"));
}

TEST(FimMetrics, CopyLineAboveTakesThePreviousNonBlankLine) {
  EXPECT_EQ(copy_line_above("int a = 1;\n\n    foo(bar);  \n   \n"), "foo(bar);");
  EXPECT_EQ(copy_line_above("  x;\n"), "x;");
  EXPECT_EQ(copy_line_above("\n\n"), "");
  EXPECT_EQ(copy_line_above(""), "");
  // On the hand file's line 5 ("  return s;"), the line above is line 4.
  const auto cases = line_cases("x.cpp", kFile, 0, 4);
  EXPECT_EQ(copy_line_above(cases[3].prefix), "int s = a + b;");
  EXPECT_FALSE(first_line_match(copy_line_above(cases[3].prefix), cases[3].truth));
}

TEST(FimMetrics, PredictionsAreCutByKind) {
  FimCase line;
  EXPECT_EQ(fim_prediction(line, "foo();\nbar();"), "foo();");
  FimCase body;
  body.kind = FimKind::kBody;
  body.problem.stop_tokens = {"\n}"};
  EXPECT_EQ(fim_prediction(body, "  x();\n  y();\n}\nint z;"), "  x();\n  y();");
  EXPECT_EQ(fim_prediction(body, "  x();\n\n"), "  x();");
}

TEST(FimContext, ModesParseAndBadOnesAreRefused) {
  EXPECT_EQ(parse_fim_contexts("none,graph"), (std::vector<FimContext>{FimContext::kNone, FimContext::kGraph}));
  EXPECT_THROW(parse_fim_contexts("none,bogus"), Error);
  EXPECT_THROW(parse_fim_contexts("none,none"), Error);
  EXPECT_THROW(parse_fim_contexts(""), Error);
}

// Graph mode is the serving-time context (workspace::context_at) over the package's files: for the cursor in user(),
// the caller top() of another file and the callee helper() of a third; the line being predicted calls scale(), which
// must not show (the text to predict is not in the window). Functions of the current file are in the window already.
TEST(FimContext, NeighboursAreOtherFilesOfThePackageAndGraphIsTheServersContext) {
  const std::vector<HeldOutFile> files = {
      {"p", "src/b.cpp",
       "int local(int x) {\n  return x;\n}\n"                                              // lines 1-3
       "int user(int y) {\n  int z = helper(y);\n  z = scale(z);\n  return z + 1;\n}\n"},  // lines 4-8
      {"p", "src/a.cpp", "int one;\nint two;\nint three;\n"},
      {"p", "src/h.cpp", "int helper(int x) {\n  return x * 2;\n}\nint scale(int x) {\n  return x * 3;\n}\n"},
      {"p", "src/t.cpp", "int top() {\n  return user(2);\n}\n"},
      {"q", "src/c.cpp", "int other;\n"},
  };
  FimContextSource source(files, FimContextOptions{2, 16});
  FimCase c;
  c.file = 0;
  c.line = 6;  // user()'s "z = scale(z);", the cursor after the indentation
  const std::string text = files[0].text;
  const size_t line6 = text.find("  z = scale(z);");
  c.prefix = text.substr(0, line6);
  c.prompt = "  ";
  c.suffix = text.substr(text.find('\n', line6));
  const auto n = source.chunks(c, FimContext::kNeighbours);
  ASSERT_EQ(n.size(), 3u);  // the other files of package p by path, their first two lines
  EXPECT_EQ(n[0].filename, "src/a.cpp");
  EXPECT_EQ(n[0].text, "int one;\nint two;\n");
  EXPECT_EQ(n[1].filename, "src/h.cpp");
  EXPECT_EQ(n[2].filename, "src/t.cpp");
  EXPECT_TRUE(source.chunks(c, FimContext::kNone).empty());
  const auto g = source.chunks(c, FimContext::kGraph);
  ASSERT_EQ(g.size(), 2u);  // oldest first: the caller, then the callee, each cut to chunk_lines (2) lines
  EXPECT_EQ(g[0].filename, "src/t.cpp");
  EXPECT_EQ(g[0].text, "int top() {\n  return user(2);\n");
  EXPECT_EQ(g[1].filename, "src/h.cpp");
  EXPECT_EQ(g[1].text, "int helper(int x) {\n  return x * 2;\n");
  c.prefix = text + "\n";  // past every definition
  c.prompt = c.suffix = "";
  EXPECT_TRUE(source.chunks(c, FimContext::kGraph).empty());
}

// Workspace use, counted on the copy-line-above baseline's predictions (no model): a line calling a function the
// package defines counts, a name followed by "(" that the package does not define does not; identifiers that no file
// of the package holds and the standard list lacks are invented. Hand-counted per case below.
TEST(FimWorkspaceUse, CallsOfPackageFunctionsAndInventedIdentifiersAreCounted) {
  const std::vector<HeldOutFile> files = {
      {"p", "src/a.cpp", "int helper(int x) {\n  return x * 2;\n}\nint total(int n) {\n  return helper(n);\n}\n"},
      {"p", "src/b.cpp", "int count = 0;\n"},
      {"q", "src/c.cpp", "int unrelated(int v) {\n  return v;\n}\n"},
  };
  auto line_case = [](size_t file, const std::string& above, const std::string& truth) {
    FimCase c;
    c.file = file;
    c.prefix = above + "\n";
    c.prompt = "  ";
    c.truth = truth;
    c.name = "case";
    return c;
  };
  const std::vector<FimCase> cases = {
      // copies "int y = helper(count);": calls helper (package p); identifiers y declared, helper, count known.
      line_case(0, "  int y = helper(count);", "return helper(y);"),
      // copies "int y = unrelated(zz);": unrelated is package q's, so no call of p; unrelated and zz unknown to p.
      line_case(1, "  int y = unrelated(zz);", "return y;"),
      // copies "return max(count, 1);": max is not p's function; known only through the standard list.
      line_case(0, "  return max(count, 1);", "return count;"),
  };
  const std::set<std::string> standard = {"max"};
  FimRunOptions o;
  o.contexts = {FimContext::kNone};
  o.standard_identifiers = &standard;
  const FimReport r = run_fim(files, cases, {}, o);
  ASSERT_EQ(r.scores[0].source, "copy-line-above");
  const FimScore& s = r.scores[0];
  EXPECT_EQ(s.cases, 3u);
  EXPECT_EQ(s.workspace_calls, 1u);             // the first case only
  EXPECT_EQ(s.identifiers, 6u);                 // {helper, count}, {unrelated, zz}, {max, count}
  EXPECT_EQ(s.invented, 2u);                    // unrelated, zz
  EXPECT_EQ(r.line_truth_workspace_calls, 1u);  // "return helper(y);"
  const auto j = r.json();
  EXPECT_NEAR(j["scores"][0]["workspace_call_rate"].get<double>(), 1.0 / 3, 1e-12);
  EXPECT_NEAR(j["scores"][0]["invented_identifier_rate"].get<double>(), 2.0 / 6, 1e-12);
  EXPECT_EQ(j["truth_workspace_calls"]["line"], 1);
  o.standard_identifiers = nullptr;  // max is then invented too
  EXPECT_EQ(run_fim(files, cases, {}, o).scores[0].invented, 3u);
}

// The command on a corpus of two held-out files with a tiny random model of the 512-id code tokenizer.
TEST(FimCli, RunsOnATinyCorpusAndWritesTheReports) {
  namespace fs = std::filesystem;
  const std::string dir = testing::TempDir() + "/slm_fim_cli_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/corpus/cpp");
  {
    std::ofstream f(dir + "/corpus/cpp/test.jsonl");
    f << nlohmann::json{{"package", "p"}, {"path", "/src/x.cpp"}, {"domain", "cpp"}, {"text", kFile}}.dump() << "\n"
      << nlohmann::json{{"package", "p"}, {"path", "/src/README"}, {"text", "not C++\n"}}.dump() << "\n"
      << nlohmann::json{{"package", "p"}, {"path", "/src/y.cpp"}, {"text", "int y = 1;\nint w = 2;\n"}}.dump() << "\n";
  }
  std::ofstream(dir + "/recipe.json") << R"({"name": "tiny-fim", "vocab_size": 512, "d_model": 16, "depth": 2,
    "pattern": "A", "seq_len": 128, "attention": {"heads": 2, "kv_heads": 1, "head_dim": 8}})";
  const std::string args = "eval fim --corpus " + dir + "/corpus --recipe " + dir + "/recipe.json --tokenizer " +
                           test::source_path("tokenizer/slm-code-512.model") +
                           " --cases 3 --body-cases 1 --line-tokens 4 --body-tokens 8 --jobs 1 --out " + dir +
                           "/out --json";
  const auto r = test::run_slm(args);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(read_file(dir + "/out/fim.json"));
  EXPECT_EQ(j["files"], 2);  // the README is no C++ file
  EXPECT_EQ(j["split"], "test");
  EXPECT_EQ(j["cases"]["line"], 3);
  EXPECT_EQ(j["cases"]["body_candidates"], 1);
  EXPECT_EQ(j["cases"]["body"], 1);  // its file compiles as written
  ASSERT_EQ(j["sources"].size(), 2u);
  // Per kind: the baseline, then the random model in each of the three modes.
  ASSERT_EQ(j["scores"].size(), 8u);
  const std::vector<std::string> contexts = {"-", "none", "neighbours", "graph"};
  for (size_t i = 0; i < 8; ++i) {
    const auto& s = j["scores"][i];
    EXPECT_EQ(s["kind"], i < 4 ? "line" : "body");
    EXPECT_EQ(s["source"], i % 4 == 0 ? "copy-line-above" : "random");
    EXPECT_EQ(s["context"], contexts[i % 4]);
    EXPECT_EQ(s["cases"], i < 4 ? 3 : 1);
    EXPECT_GE(s["edit_similarity"].get<double>(), 0.0);
    EXPECT_LE(s["edit_similarity"].get<double>(), 1.0);
    if (i >= 4) {
      EXPECT_TRUE(s.contains("compile_rate")) << s.dump();
    }
    if (i % 4 != 0) {
      EXPECT_GT(s["mean_prompt_tokens"].get<double>(), 0.0);
    }
  }
  // The baseline's body is the '{' line, "int add(int a, int b) {" or "std::string g() {": a nested definition.
  EXPECT_EQ(j["scores"][4]["compiled"], 0);
  EXPECT_EQ(j["scores"][4]["exact_match"], 0.0);
  // Every prediction, one line each: 4 cases times (the baseline and three modes).
  const std::string predictions = read_file(dir + "/out/predictions.jsonl");
  EXPECT_EQ(std::count(predictions.begin(), predictions.end(), '\n'), 16);
  EXPECT_TRUE(fs::exists(dir + "/out/fim.md"));
  EXPECT_TRUE(fs::exists(dir + "/out/fim.png"));
  EXPECT_EQ(nlohmann::json::parse(r.out.substr(r.out.find("{\n"))), j);

  const auto bad =
      test::run_slm("eval fim --corpus " + dir + "/corpus --recipe " + dir + "/recipe.json --tokenizer " +
                    test::source_path("tokenizer/slm-code-512.model") + " --context none,sideways --out ''");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("unknown mode 'sideways'"), std::string::npos) << bad.out;
  const auto missing = test::run_slm("eval fim --corpus " + dir + "/nowhere --recipe " + dir + "/recipe.json");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("needs the code tokenizer"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace slm::eval

namespace slm::eval {
namespace {

TEST(FimLatency, RequestsAreShapedAsLlamaVimSendsThem) {
  const auto cases = line_cases("x.cpp", kFile, 0, 4);
  const FimCase& c = cases[3];  // line 5, "  return s;": its prefix holds lines 1-4 (77 bytes, line 4 is 17)
  FimLatencyOptions o;
  o.window.prefix_chars = 17;  // line 4 fits exactly
  o.window.suffix_lines = 2;
  o.n_predict = 32;
  auto j = llama_vim_request(c, 0, o);
  EXPECT_EQ(j["input_prefix"], "  int s = a + b;\n");
  EXPECT_EQ(j["prompt"], "  ");
  // The truth is never sent: the line's end, then two lines: "}" and the blank one.
  EXPECT_EQ(j["input_suffix"], "\n}\n\n");
  EXPECT_EQ(j["n_indent"], 2);
  EXPECT_EQ(j["n_predict"], 32);
  EXPECT_EQ(j["cache_prompt"], true);
  EXPECT_EQ(j["input_extra"], nlohmann::json::array());
  EXPECT_EQ(j["samplers"], (nlohmann::json{"top_k", "top_p", "infill"}));
  EXPECT_EQ(j["model"], "");
  // Four characters typed: the cursor's line grows, the suffix stays (the cache keeps everything before P's end).
  j = llama_vim_request(c, 4, o);
  EXPECT_EQ(j["prompt"], "  retu");
  EXPECT_EQ(j["input_suffix"], "\n}\n\n");
  EXPECT_EQ(llama_vim_request(c, 100, o)["prompt"], "  return s;");
  o.window.prefix_chars = 16;  // line 4 no longer fits: whole lines only
  EXPECT_EQ(llama_vim_request(c, 0, o)["input_prefix"], "");
  o.window.prefix_chars = 1500;
  EXPECT_EQ(llama_vim_request(c, 0, o)["input_prefix"], c.prefix);
  // The quality run's window is the same cut; 0 keeps a side whole.
  const FimCase w = fim_window(c, FimWindow{17, 0});
  EXPECT_EQ(w.prefix, "  int s = a + b;\n");
  EXPECT_EQ(w.suffix, c.suffix);
  EXPECT_EQ(w.prompt, c.prompt);
  EXPECT_EQ(w.truth, c.truth);
  EXPECT_EQ(fim_window(c, FimWindow{0, 2}).prefix, c.prefix);
  EXPECT_EQ(fim_window(c, FimWindow{0, 2}).suffix, "\n}\n\n");
}

TEST(FimLatency, NearestRankPercentiles) {
  const std::vector<double> v = {100, 10, 90, 20, 80, 30, 70, 40, 60, 50};
  EXPECT_EQ(percentile(v, 50), 50);   // rank ceil(5) = 5
  EXPECT_EQ(percentile(v, 95), 100);  // rank ceil(9.5) = 10
  EXPECT_EQ(percentile(v, 10), 10);
  EXPECT_EQ(percentile({7}, 95), 7);
  EXPECT_EQ(percentile({}, 50), 0);
}

}  // namespace
}  // namespace slm::eval
