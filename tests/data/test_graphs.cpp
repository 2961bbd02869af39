// Context graphs: the call edges of a hand-written project, resolution rules, bad input, budget packing, CLI.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "data/data_test_util.h"
#include "slm/data/callgraph.h"
#include "slm/data/graph_docs.h"
#include "slm/data/shards.h"
#include "slm/data/tokenizer.h"
#include "slm/util/error.h"

namespace slm::test {
namespace {

using data::CallGraph;

// A function's name in these tests: its signature, plus its file when it is file-local (two files may each
// have their own static twice()).
std::string key(const CallGraph& g, uint32_t i) {
  const auto& f = g.functions[i];
  return f.signature() + (f.file_local ? "@" + f.file : "");
}

std::set<std::string> function_keys(const CallGraph& g) {
  std::set<std::string> out;
  for (uint32_t i = 0; i < g.functions.size(); ++i) out.insert(key(g, i));
  return out;
}

std::set<std::pair<std::string, std::string>> edges(const CallGraph& g) {
  std::set<std::pair<std::string, std::string>> out;
  for (uint32_t i = 0; i < g.functions.size(); ++i)
    for (uint32_t j : g.callees[i]) out.insert({key(g, i), key(g, j)});
  return out;
}

uint32_t index_of(const CallGraph& g, const std::string& k) {
  for (uint32_t i = 0; i < g.functions.size(); ++i)
    if (key(g, i) == k) return i;
  ADD_FAILURE() << "no function " << k;
  return 0;
}

CallGraph project_graph() {
  data::CallGraphOptions o;
  o.src_dir = source_path("tests/data/graph_project");
  return data::build_call_graph(o);
}

std::string dir_for(const std::string& tag) {
  return fresh_dir(tag + "_" + std::to_string(getpid()));
}

TEST(GraphExtract, ProjectFunctionsAndEdgesEqualTheKnownSets) {
  const CallGraph g = project_graph();
  EXPECT_EQ(g.files, 6u);
  EXPECT_EQ(g.files_skipped, 0u);
  EXPECT_TRUE(g.warnings.empty());
  // Every definition with a body, read off the sources (= default, pure virtual and declarations are not).
  const std::set<std::string> functions = {
      "geo::square(1)",
      "geo::distance(2)",
      "geo::norm(1)",
      "geo::Shape::scaled_area(1)",
      "geo::Circle::Circle(1)",
      "geo::Circle::Circle(2)",
      "geo::Circle::area(0)",
      "geo::Circle::grow(1)",
      "geo::clamp_to(3)",
      "util::operator+(2)",
      "util::detail::helper(1)",
      "util::add(2)",
      "util::add(3)",
      "util::factorial(1)",
      "util::twice(1)@math_util.cc",
      "util::sum_twice(1)",
      "twice(1)@stats.cc",
      "stats::Accumulator::push(1)",
      "stats::Accumulator::total(0)",
      "stats::Accumulator::mean(0)",
      "stats::Accumulator::push_all(2)",
      "run_stats(0)",
      "app::Report::value(0)",
      "main(2)",
  };
  EXPECT_EQ(function_keys(g), functions);
  // The calls, by reading the code. Not edges: virtual area() from Shape (no definition), std::sqrt,
  // values.push_back (a library type), the lambda cube(2.0) (a variable), casts, aggregate initialization.
  const std::set<std::pair<std::string, std::string>> known = {
      {"geo::norm(1)", "geo::distance(2)"},  // through the header, defined in geometry.cc
      {"geo::Shape::scaled_area(1)", "geo::square(1)"},
      {"geo::Circle::Circle(2)", "geo::Circle::Circle(1)"},  // delegating constructor
      {"geo::distance(2)", "geo::square(1)"},
      {"geo::Circle::area(0)", "geo::square(1)"},
      {"geo::Circle::grow(1)", "geo::clamp_to(3)"},  // explicit template arguments
      {"geo::Circle::grow(1)", "geo::Circle::area(0)"},
      {"util::operator+(2)", "util::add(2)"},
      {"util::add(3)", "util::add(2)"},  // overload told apart by arity
      {"util::add(3)", "util::detail::helper(1)"},
      {"util::factorial(1)", "util::factorial(1)"},  // recursion
      {"util::twice(1)@math_util.cc", "util::add(2)"},
      {"util::sum_twice(1)", "util::twice(1)@math_util.cc"},  // its own file's static, not stats.cc's
      {"stats::Accumulator::push(1)", "util::add(2)"},        // using namespace util
      {"stats::Accumulator::push(1)", "twice(1)@stats.cc"},   // anonymous namespace
      {"stats::Accumulator::mean(0)", "stats::Accumulator::total(0)"},
      {"stats::Accumulator::push_all(2)", "stats::Accumulator::push(1)"},  // this->push
      {"run_stats(0)", "stats::Accumulator::push(1)"},                     // acc.push and heap->push (make_unique)
      {"run_stats(0)", "util::add(3)"},
      {"run_stats(0)", "stats::Accumulator::push_all(2)"},
      {"run_stats(0)", "geo::square(1)"},  // inside a lambda: the enclosing function calls it
      {"run_stats(0)", "stats::Accumulator::mean(0)"},
      {"run_stats(0)", "util::factorial(1)"},
      {"app::Report::value(0)", "geo::Circle::area(0)"},  // circle->area() through a data member's type
      {"app::Report::value(0)", "geo::norm(1)"},
      {"main(2)", "geo::Circle::Circle(1)"},      // geo::Circle c(2.0)
      {"main(2)", "geo::Circle::Circle(2)"},      // new geo::Circle(1.0, 3.0)
      {"main(2)", "geo::Shape::scaled_area(1)"},  // inherited method
      {"main(2)", "geo::Circle::grow(1)"},
      {"main(2)", "app::Report::value(0)"},
      {"main(2)", "util::operator+(2)"},
      {"main(2)", "run_stats(0)"},
      {"main(2)", "util::sum_twice(1)"},
  };
  EXPECT_EQ(edges(g), known);
  // callers is the transpose of callees.
  for (uint32_t i = 0; i < g.functions.size(); ++i)
    for (uint32_t j : g.callees[i])
      EXPECT_TRUE(std::binary_search(g.callers[j].begin(), g.callers[j].end(), i)) << key(g, i) << " -> " << key(g, j);
  EXPECT_EQ(g.edge_count(), known.size());
}

TEST(GraphExtract, DefinitionTextAndLocation) {
  const CallGraph g = project_graph();
  const auto& fact = g.functions[index_of(g, "util::factorial(1)")];
  EXPECT_EQ(fact.file, "math_util.cc");
  EXPECT_EQ(fact.line, 15u);
  EXPECT_EQ(fact.text, "long factorial(int n) { return n <= 1 ? 1 : n * factorial(n - 1); }");
  // The comment right above belongs to the definition.
  const auto& add3 = g.functions[index_of(g, "util::add(3)")];
  EXPECT_EQ(add3.line, 12u);
  EXPECT_EQ(add3.text.rfind("// The 3-argument overload calls the 2-argument one", 0), 0u) << add3.text;
  // The template header too; a method keeps its indentation so its lines stay aligned.
  const auto& clamp = g.functions[index_of(g, "geo::clamp_to(3)")];
  EXPECT_EQ(clamp.file, "include/geometry.h");
  EXPECT_EQ(clamp.line, 36u);
  EXPECT_EQ(clamp.text,
            "template <typename T>\nT clamp_to(T v, T lo, T hi) {\n  return v < lo ? lo : (hi < v ? hi : v);\n}");
  const auto& push = g.functions[index_of(g, "stats::Accumulator::push(1)")];
  EXPECT_EQ(push.line, 20u);
  EXPECT_EQ(push.text, "  void push(int v) {\n    total_ = add(total_, twice(v));\n    ++count_;\n  }");
  EXPECT_TRUE(push.is_method);
  EXPECT_FALSE(g.functions[index_of(g, "util::add(2)")].is_method);
}

TEST(GraphExtract, AmbiguousCallsPreferIncludedFilesAndOtherwiseGetNoEdge) {
  // Five same-arity get() overloads, one per header: a caller that includes one of them links to that one;
  // a caller that includes none cannot choose among five and gets no edge; two candidates are both linked.
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 5; ++i)
    files.push_back({"get" + std::to_string(i) + ".h",
                     "struct T" + std::to_string(i) + " {};\nint get(T" + std::to_string(i) + " x) { return 0; }\n"});
  files.push_back({"a.cc", "#include \"get3.h\"\nint a() { return get(T3{}); }\n"});
  files.push_back({"b.cc", "int b() { return get(1); }\n"});
  files.push_back({"c.h", "int pick(int x) { return x; }\n"});
  files.push_back({"d.h", "int pick(long x) { return 1; }\n"});
  files.push_back({"e.cc", "int e() { return pick(2); }\n"});
  const CallGraph g = data::build_call_graph(files);
  auto fn = [&](const std::string& file, const std::string& sig) {
    for (uint32_t i = 0; i < g.functions.size(); ++i)
      if (g.functions[i].file == file && g.functions[i].signature() == sig) return i;
    ADD_FAILURE() << file << " " << sig;
    return 0u;
  };
  EXPECT_EQ(g.callees[fn("a.cc", "a(0)")], std::vector<uint32_t>{fn("get3.h", "get(1)")});
  EXPECT_TRUE(g.callees[fn("b.cc", "b(0)")].empty());
  EXPECT_EQ(g.ambiguous_call_sites, 1u);
  std::vector<uint32_t> picks = {fn("c.h", "pick(1)"), fn("d.h", "pick(1)")};
  std::sort(picks.begin(), picks.end());
  EXPECT_EQ(g.callees[fn("e.cc", "e(0)")], picks);
}

TEST(GraphExtract, ParseBudgetSkipsTheRestOfAGraphsFiles) {
  // Once a graph has spent its parse budget (here: anything at all), its remaining files are skipped with a warning
  // naming the budget; the files parsed before it keep their functions.
  std::vector<std::pair<std::string, std::string>> files = {{"a.cc", "int f() { return 1; }\n"},
                                                            {"b.cc", "int g() { return f(); }\n"},
                                                            {"c.cc", "int h() { return g(); }\n"}};
  data::CallGraphOptions o;
  o.time_budget_s = 1e-12;
  const CallGraph g = data::build_call_graph(files, o);
  EXPECT_EQ(function_keys(g), std::set<std::string>{"f(0)"});
  EXPECT_EQ(g.files_skipped, 2u);
  ASSERT_EQ(g.warnings.size(), 2u);
  EXPECT_NE(g.warnings[0].find("b.cc: skipped: over the graph's parse time budget"), std::string::npos)
      << g.warnings[0];
  o.time_budget_s = 0;  // no limit: all three
  EXPECT_EQ(function_keys(data::build_call_graph(files, o)), (std::set<std::string>{"f(0)", "g(0)", "h(0)"}));
}

TEST(GraphExtract, MethodSearchThroughDiamondAndCyclicBases) {
  // A diamond reaches the shared base's method (once). Bases that name each other in a cycle (misparsed code) are
  // each searched once: R's call of q() goes R -> P -> Q and finds Q::q (R's own second base, Q, is then already
  // searched); its call of missing() searches R, P and Q and ends with no edge instead of walking the cycle.
  const CallGraph g = data::build_call_graph(std::vector<std::pair<std::string, std::string>>{
      {"d.h",
       "struct D { int m() { return 1; } };\nstruct B : D {};\nstruct C : D {};\n"
       "struct A : B, C { int run() { return this->m(); } };\n"},
      {"cycle.h",
       "struct P : Q, R {};\nstruct Q : P, R { int q() { return 2; } };\n"
       "struct R : P, Q { int r() { return this->missing() + this->q(); } };\n"}});
  EXPECT_EQ(function_keys(g), (std::set<std::string>{"D::m(0)", "A::run(0)", "Q::q(0)", "R::r(0)"}));
  EXPECT_EQ(edges(g),
            (std::set<std::pair<std::string, std::string>>{{"A::run(0)", "D::m(0)"}, {"R::r(0)", "Q::q(0)"}}));
  EXPECT_EQ(g.callees[index_of(g, "A::run(0)")], std::vector<uint32_t>{index_of(g, "D::m(0)")});
  EXPECT_EQ(g.callees[index_of(g, "R::r(0)")], std::vector<uint32_t>{index_of(g, "Q::q(0)")});
  EXPECT_EQ(g.callers[index_of(g, "Q::q(0)")], std::vector<uint32_t>{index_of(g, "R::r(0)")});
  // m(), missing() and q(): three call sites, of which missing() resolves to nothing.
  EXPECT_EQ(g.call_sites, 3u);
  EXPECT_EQ(g.resolved_call_sites, 2u);
  EXPECT_EQ(g.ambiguous_call_sites, 0u);
}

TEST(GraphExtract, ArityDefaultsVariadicAndUnknownReceivers) {
  const CallGraph g = data::build_call_graph(std::vector<std::pair<std::string, std::string>>{
      {"x.cc",
       "int opt(int a, int b = 2) { return a + b; }\n"
       "int var(const char* f, ...) { return 0; }\n"
       "struct Only { int unique_name(int v) { return v; } };\n"
       "struct P { int size() const { return 1; } };\n"
       "struct Q { int size() const { return 2; } };\n"
       "int use(Only* o) {\n"
       "  auto w = lookup();\n"  // type unknown
       "  return opt(1) + opt(1, 2) + opt(1, 2, 3) + var(\"\") + var(\"\", 1, 2) + w.unique_name(1) + w.size();\n"
       "}\n"}});
  auto idx = [&](const std::string& sig) {
    for (uint32_t i = 0; i < g.functions.size(); ++i)
      if (g.functions[i].signature() == sig) return i;
    ADD_FAILURE() << sig;
    return 0u;
  };
  std::vector<uint32_t> expect = {idx("opt(1-2)"), idx("var(1+)"), idx("Only::unique_name(1)")};
  std::sort(expect.begin(), expect.end());
  // opt(1, 2, 3) fits no opt; w.size() has two candidate classes, so no edge.
  EXPECT_EQ(g.callees[idx("use(1)")], expect);
}

TEST(GraphExtract, ExportMacrosAndStandardMemberNames) {
  // `class LIB_API Widget` still parses as a class; x.c_str() on an unknown receiver is taken for a standard
  // library call even though Widget::c_str is the only project method of that name.
  const CallGraph g = data::build_call_graph(std::vector<std::pair<std::string, std::string>>{
      {"w.h",
       "namespace lib {\nclass LIB_API Widget final : public Base {\n public:\n  int run() const { return 1; }\n"
       "  const char* c_str() const { return \"\"; }\n};\n}  // namespace lib\n"},
      {"u.cc", "int use(lib::Widget w) {\n  auto x = make();\n  return w.run() + *x.c_str();\n}\n"}});
  EXPECT_EQ(function_keys(g), (std::set<std::string>{"lib::Widget::run(0)", "lib::Widget::c_str(0)", "use(1)"}));
  EXPECT_EQ(edges(g), (std::set<std::pair<std::string, std::string>>{{"use(1)", "lib::Widget::run(0)"}}));
  EXPECT_EQ(g.functions[index_of(g, "lib::Widget::run(0)")].text, "  int run() const { return 1; }");
}

TEST(GraphExtract, BadInput) {
  EXPECT_NE(error_of([] {
              data::CallGraphOptions o;
              o.src_dir = "/nonexistent/graph/src";
              data::build_call_graph(o);
            }).find("source directory not found: /nonexistent/graph/src"),
            std::string::npos);
  const std::string empty = dir_for("empty");
  write_file(empty + "/notes.txt", "no C++ here\n");
  EXPECT_NE(error_of([&] {
              data::CallGraphOptions o;
              o.src_dir = empty;
              data::build_call_graph(o);
            }).find("no C++ sources"),
            std::string::npos);

  const std::string dir = dir_for("bad");
  write_file(dir + "/good.cc", "int f(int x) { return x; }\nint g() { return f(1); }\n");
  write_file(dir + "/junk.cc", "}}} {{{ ))) ((( ;;; ### @@ $$ ``` ' \" <<< >>> ]]] [[[\n");
  write_file(dir + "/prose.h", read_file(source_path("README.md")));
  write_file(dir + "/binary.cpp", std::string("int main() {}\n\0\xff\xfe garbage", 28));
  data::CallGraphOptions o;
  o.src_dir = dir;
  const CallGraph g = data::build_call_graph(o);
  EXPECT_EQ(g.files, 1u);
  EXPECT_EQ(g.files_skipped, 3u);
  ASSERT_EQ(g.warnings.size(), 3u);
  std::string all;
  for (const auto& w : g.warnings) all += w + "\n";
  EXPECT_NE(all.find("binary.cpp: skipped: not UTF-8 text"), std::string::npos) << all;
  EXPECT_NE(all.find("junk.cc: skipped: not parseable as C++"), std::string::npos) << all;
  EXPECT_NE(all.find("prose.h: skipped: not parseable as C++"), std::string::npos) << all;
  EXPECT_EQ(edges(g), (std::set<std::pair<std::string, std::string>>{{"g(0)", "f(1)"}}));
}

// A hand-made graph: target T (0) with direct caller A (1, shares T's names), direct caller B (2, shares none),
// caller-of-caller C (3), direct callee D (4); costs chosen so the budget decides.
CallGraph tiny_graph() {
  CallGraph g;
  auto fn = [&](const std::string& name, const std::string& text) {
    data::FunctionInfo f;
    f.name = name;
    f.file = "t.cc";
    f.line = static_cast<uint32_t>(g.functions.size() + 1);
    f.text = text;
    g.functions.push_back(f);
  };
  fn("T", "int T() { return alpha_value + beta_value; }");
  fn("A", "int A() { return T() + alpha_value + beta_value; }");
  fn("B", "long B() { T(); }");
  fn("C", "int C() { return A(); }");
  fn("D", "int D() { return 0; }");
  g.callees = {{4}, {0}, {0}, {1}, {}};
  g.callers = {{1, 2}, {3}, {}, {}, {0}};
  return g;
}

TEST(GraphDocs, TrimsTheLeastRelatedWholeFunctionsFirst) {
  const CallGraph g = tiny_graph();
  const std::vector<uint64_t> cost = {10, 10, 10, 10, 10};  // each piece; +1 for its <|file|> marker
  data::GraphDocOptions o;
  o.depth = 2;
  data::GraphDocStats st;
  // Everything: 5 + 5 * 11 = 60 tokens. Order: farther callers first, then nearer; callees nearest first.
  o.budget = 60;
  auto docs = data::plan_graph_documents(g, cost, o, &st);
  ASSERT_FALSE(docs.empty());
  EXPECT_EQ(docs[0].target, 0u);
  EXPECT_EQ(docs[0].callers, (std::vector<uint32_t>{3, 1, 2}));
  EXPECT_EQ(docs[0].callees, (std::vector<uint32_t>{4}));
  EXPECT_EQ(docs[0].tokens, 60u);
  EXPECT_EQ(docs[0].dropped, 0u);
  // One token less: the farthest (C, depth 2) goes first.
  o.budget = 59;
  docs = data::plan_graph_documents(g, cost, o);
  EXPECT_EQ(docs[0].callers, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(docs[0].dropped, 1u);
  EXPECT_EQ(docs[0].tokens, 49u);
  // Room for target + two direct relatives: of A, B and D, the one sharing the smallest share of its names
  // (3+ characters) with T goes: B ({long}: none); A and D use only names T also uses.
  o.budget = 5 + 3 * 11;
  docs = data::plan_graph_documents(g, cost, o);
  EXPECT_EQ(docs[0].callers, (std::vector<uint32_t>{1}));
  EXPECT_EQ(docs[0].callees, (std::vector<uint32_t>{4}));
  EXPECT_LE(docs[0].tokens, o.budget);
  // A target that alone exceeds the budget is skipped, never cut.
  o.budget = 15;
  docs = data::plan_graph_documents(g, cost, o, &st);
  EXPECT_EQ(st.too_large, 5u - st.isolated);
  EXPECT_TRUE(docs.empty());
}

TEST(GraphDocs, ProjectDocumentsKeepOrderBudgetAndWholeFunctions) {
  const CallGraph g = project_graph();
  const auto tok = data::Tokenizer::load(source_path("tokenizer/slm-code-32k.model"));
  std::vector<std::vector<uint32_t>> piece_ids;
  std::vector<uint64_t> piece_tokens;
  for (const auto& f : g.functions) {
    piece_ids.push_back(tok.encode(data::graph_piece(f)));
    piece_tokens.push_back(piece_ids.back().size());
  }
  const uint32_t callers_id = tok.special_id("<|callers|>"), target_id = tok.special_id("<|target|>"),
                 callees_id = tok.special_id("<|callees|>"), file_id = tok.special_id("<|file|>");
  for (uint64_t budget : {uint64_t{65536}, uint64_t{400}, uint64_t{150}}) {
    data::GraphDocOptions o;
    o.budget = budget;
    o.depth = budget == 65536 ? 1 : 2;
    const auto docs = data::plan_graph_documents(g, piece_tokens, o);
    ASSERT_FALSE(docs.empty());
    uint64_t dropped = 0;
    for (const auto& d : docs) dropped += d.dropped;
    if (budget == 150) {
      EXPECT_GT(dropped, 0u) << "the tight budget should trim some documents";
    }
    for (const auto& d : docs) {
      const auto ids = data::graph_document_ids(d, piece_ids, tok);
      EXPECT_EQ(ids.size(), d.tokens);
      EXPECT_LE(ids.size(), budget);
      ASSERT_GE(ids.size(), 6u);
      EXPECT_EQ(ids.front(), tok.bos_id());
      EXPECT_EQ(ids.back(), tok.eos_id());
      EXPECT_EQ(ids[1], callers_id);
      // Walk the sections: each <|file|> opens one whole piece, exactly the function's own tokens.
      std::vector<uint32_t> order;  // functions as they appear
      std::vector<int> section;     // 0 callers, 1 target, 2 callees
      int sec = 0;
      size_t i = 2;
      while (i + 1 < ids.size()) {
        if (ids[i] == target_id || ids[i] == callees_id) {
          const int next = ids[i] == target_id ? 1 : 2;
          ASSERT_EQ(next, sec + 1) << "sections out of order";
          sec = next;
          ++i;
          continue;
        }
        ASSERT_EQ(ids[i], file_id);
        const uint32_t f = order.size() < d.callers.size()    ? d.callers[order.size()]
                           : order.size() == d.callers.size() ? d.target
                                                              : d.callees[order.size() - d.callers.size() - 1];
        const auto& p = piece_ids[f];
        ASSERT_LE(i + 1 + p.size(), ids.size());
        EXPECT_TRUE(std::equal(p.begin(), p.end(), ids.begin() + static_cast<long>(i) + 1)) << "piece cut or replaced";
        order.push_back(f);
        section.push_back(sec);
        i += 1 + p.size();
      }
      EXPECT_EQ(sec, 2);
      EXPECT_EQ(order.size(), d.callers.size() + 1 + d.callees.size());
      // The text decodes back to the same pieces.
      EXPECT_EQ(tok.decode(ids), [&] {
        std::string s;
        for (uint32_t f : order) s += data::graph_piece(g.functions[f]);
        return s;
      }());
      if (budget == 65536) {
        // Room for everything: the direct callers and callees, exactly (a self edge adds nothing).
        std::set<uint32_t> want_callers(g.callers[d.target].begin(), g.callers[d.target].end());
        std::set<uint32_t> want_callees(g.callees[d.target].begin(), g.callees[d.target].end());
        want_callers.erase(d.target);
        want_callees.erase(d.target);
        for (uint32_t c : want_callers) want_callees.erase(c);  // mutual recursion: listed once, as a caller
        EXPECT_EQ(std::set<uint32_t>(d.callers.begin(), d.callers.end()), want_callers);
        EXPECT_EQ(std::set<uint32_t>(d.callees.begin(), d.callees.end()), want_callees);
        EXPECT_EQ(d.dropped, 0u);
      }
    }
  }
}

TEST(GraphCli, WritesJsonlAndShards) {
  const std::string dir = dir_for("cli");
  const std::string src = source_path("tests/data/graph_project");
  auto r = run_slm("data graphs --src " + src + " --out " + dir + "/g.jsonl --budget 300 --shards " + dir +
                   "/shards --package graph_project --license MIT --tokenizer " +
                   source_path("tokenizer/slm-code-32k.model"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(dir + "/g.jsonl");
  std::string line;
  std::vector<nlohmann::json> docs;
  while (std::getline(in, line)) docs.push_back(nlohmann::json::parse(line));
  const CallGraph g = project_graph();
  ASSERT_FALSE(docs.empty());
  auto shard = data::Shard::open(dir + "/shards/graphs-00000.slmtok");
  ASSERT_EQ(shard->doc_count(), docs.size());
  const auto meta = shard->metadata();
  for (size_t i = 0; i < docs.size(); ++i) {
    const auto& j = docs[i];
    EXPECT_EQ(j["package"].get<std::string>(), "graph_project");
    EXPECT_EQ(j["license"].get<std::string>(), "MIT");
    EXPECT_EQ(j["domain"].get<std::string>(), "cpp");
    EXPECT_LE(j["tokens"].get<uint64_t>(), 300u);
    EXPECT_EQ(shard->document(i).size(), j["tokens"].get<uint64_t>());
    EXPECT_EQ(meta[i].path, j["path"].get<std::string>());
    const std::string text = j["text"];
    const auto a = text.find("<|callers|>"), b = text.find("<|target|>"), c = text.find("<|callees|>");
    EXPECT_TRUE(a == 0 && a < b && b < c) << text;
    // The target's definition sits whole between its markers.
    const auto t = std::find_if(g.functions.begin(), g.functions.end(), [&](const data::FunctionInfo& f) {
      return f.signature() == j["target"].get<std::string>() && f.file == j["path"].get<std::string>();
    });
    ASSERT_NE(t, g.functions.end()) << j["target"];
    EXPECT_EQ(text.substr(b, c - b), "<|target|><|file|>" + data::graph_piece(*t));
  }
  // ctest runs in the build directory, where the default tokenizer path does not resolve: the missing source
  // directory must be reported first all the same.
  r = run_slm("data graphs --src /nonexistent/dir --out " + dir + "/x.jsonl");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("source directory not found: /nonexistent/dir"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace slm::test
