// The context graph at the cursor (issue 45): a planted workspace, the chunks chosen for a cursor in a known function
// (hand-listed), re-indexing after an edit, refused paths and symlinks, skipped files with their log lines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "slm/util/error.h"
#include "slm/workspace/cursor_context.h"
#include "slm/workspace/workspace.h"

namespace slm::test {
namespace {

using workspace::ChunkKind;
using workspace::Workspace;

const char* kShapesH = R"(// Copyright the shapes authors.
// Licensed under the usual terms.
#pragma once
namespace geo {
struct Circle {
  double r = 1;
  double area() const;
  void grow(double by) { r += by; }
};
double scale(double x, double k);
}  // namespace geo
)";

const char* kShapesCpp = R"(#include "geo/shapes.h"
namespace geo {
double Circle::area() const { return 3.14159 * r * r; }
double scale(double x, double k) {
  return x * k;
}
static double unused_helper(double x) { return x; }
}  // namespace geo
)";

// report() is the function the tests put the cursor in; main() calls it.
const char* kMainBefore = R"(#include "geo/shapes.h"
#include <cstdio>

double report(geo::Circle& c) {
  c.grow(2);
  double a = c.area();
)";
const char* kMainAfter = R"(
  return geo::scale(a, 0.5);
}

int main() {
  geo::Circle c;
  std::printf("%f\n", report(c));
}
)";

struct Planted {
  std::string dir;
};

Planted plant(const std::string& tag) {
  Planted p{fresh_dir(tag)};
  write_file(p.dir + "/geo/shapes.h", kShapesH);
  write_file(p.dir + "/geo/shapes.cpp", kShapesCpp);
  write_file(p.dir + "/app/main.cpp", std::string(kMainBefore) + kMainAfter);
  return p;
}

// What a cursor in report() gets (kind, name), hand-listed from the planted files: it calls Circle::grow,
// Circle::area and geo::scale and includes geo/shapes.h.
const std::set<std::pair<std::string, std::string>> kReportContext = {{"callee", "geo::Circle::grow"},
                                                                      {"callee", "geo::Circle::area"},
                                                                      {"callee", "geo::scale"},
                                                                      {"include", "geo/shapes.h"}};

std::set<std::pair<std::string, std::string>> kinds_and_names(const workspace::CursorContext& c) {
  std::set<std::pair<std::string, std::string>> out;
  for (const auto& k : c.chunks) out.insert({workspace::chunk_kind_name(k.kind), k.name});
  return out;
}

TEST(WorkspaceContext, ChoosesTheCalleesClassCallersAndHeadersOfTheFunctionAtTheCursor) {
  Planted p = plant("pick");
  Workspace ws(p.dir);
  EXPECT_EQ(ws.refresh(), 3u);
  const auto g = ws.graph();
  ASSERT_TRUE(g);
  // The cursor on report()'s empty line: it calls Circle::grow, Circle::area and geo::scale; main calls it; it
  // includes geo/shapes.h. grow is defined in the header (inline) and area/scale in shapes.cpp.
  const auto ctx = workspace::context_at(*g, "app/main.cpp", std::string(kMainBefore) + "  ", kMainAfter);
  EXPECT_EQ(ctx.function, "report");
  // main is in the window itself, so it is no caller chunk; Circle is no class of report's.
  EXPECT_EQ(kinds_and_names(ctx), kReportContext);
  // Oldest first: the include outline, then the callees with the nearest call to the cursor last.
  ASSERT_EQ(ctx.chunks.size(), 4u);
  EXPECT_EQ(ctx.chunks.front().kind, ChunkKind::kInclude);
  EXPECT_EQ(ctx.chunks.back().name, "geo::Circle::area");  // called on the line above the cursor
  for (const auto& c : ctx.chunks) {
    if (c.name == "geo::scale") {
      EXPECT_EQ(c.chunk.filename, "geo/shapes.cpp");
      EXPECT_EQ(c.chunk.text, "double scale(double x, double k) {\n  return x * k;\n}\n");
      EXPECT_EQ(c.line, 4u);
    }
    if (c.kind == ChunkKind::kInclude) {  // the license lines are left out
      EXPECT_EQ(c.chunk.text.rfind("#pragma once\nnamespace geo {\n", 0), 0u) << c.chunk.text;
    }
  }
}

// The lookups a request makes on the linked graph, against the planted files: a file by path, its functions in
// file order, and the header an #include names (the shortest path when several do, never the includer itself).
TEST(WorkspaceContext, TheGraphFindsFilesTheirFunctionsAndIncludedHeaders) {
  Planted p = plant("lookup");
  write_file(p.dir + "/vendor/geo/shapes.h", "#pragma once\nint vendored();\n");
  Workspace ws(p.dir);
  ws.refresh();
  const auto g = ws.graph();
  ASSERT_TRUE(g);
  ASSERT_NE(g->file("geo/shapes.cpp"), nullptr);
  EXPECT_EQ(g->file("geo/shapes.cpp")->path, "geo/shapes.cpp");
  EXPECT_EQ(g->file("shapes.cpp"), nullptr);
  EXPECT_EQ(g->file("app/missing.cpp"), nullptr);
  std::vector<std::string> names;
  for (uint32_t i : g->functions_of("geo/shapes.cpp")) names.push_back(g->graph().functions[i].qualified());
  EXPECT_EQ(names, (std::vector<std::string>{"geo::Circle::area", "geo::scale", "geo::unused_helper"}));
  EXPECT_TRUE(g->functions_of("app/none.cpp").empty());
  // "geo/shapes.h" names both geo/shapes.h and vendor/geo/shapes.h: the shorter path wins.
  ASSERT_NE(g->header_for("geo/shapes.h", "app/main.cpp"), nullptr);
  EXPECT_EQ(g->header_for("geo/shapes.h", "app/main.cpp")->path, "geo/shapes.h");
  EXPECT_EQ(g->header_for("shapes.h", "geo/shapes.h")->path, "vendor/geo/shapes.h");  // not the includer itself
  EXPECT_EQ(g->header_for("other/shapes.h", ""), nullptr);
  EXPECT_EQ(g->header_for("cstdio", ""), nullptr);
}

TEST(WorkspaceContext, AMethodGetsItsClassAndItsCallersCallSites) {
  Planted p = plant("method");
  Workspace ws(p.dir);
  ws.refresh();
  // The cursor in Circle::area's body in shapes.cpp: its class is in the header; report() in main.cpp calls it.
  const std::string text = kShapesCpp;
  const size_t at = text.find("return 3.14159");
  const auto ctx = workspace::context_at(*ws.graph(), "geo/shapes.cpp", text.substr(0, at), text.substr(at));
  EXPECT_EQ(ctx.function, "geo::Circle::area");
  const std::set<std::pair<std::string, std::string>> want = {
      {"class", "geo::Circle"}, {"caller", "report"}, {"include", "geo/shapes.h"}};
  EXPECT_EQ(kinds_and_names(ctx), want);
  for (const auto& c : ctx.chunks)
    if (c.kind == ChunkKind::kCaller) {
      EXPECT_EQ(c.chunk.filename, "app/main.cpp");
      EXPECT_NE(c.chunk.text.find("c.area()"), std::string::npos);
      EXPECT_EQ(c.line, 4u);
    }
}

// A method written inside its class body: the class on disk holds the lines being written (in slm eval fim, the very
// text to predict), and the window holds the class as the editor has it, so no class chunk.
TEST(WorkspaceContext, AMethodInsideItsClassGetsNoCopyOfTheClass) {
  Planted p = plant("inline");
  Workspace ws(p.dir);
  ws.refresh();
  const std::string text = kShapesH;
  const std::string hidden = "r += by;";
  const size_t at = text.find(hidden);
  const auto ctx =
      workspace::context_at(*ws.graph(), "geo/shapes.h", text.substr(0, at), text.substr(at + hidden.size()));
  EXPECT_EQ(ctx.function, "geo::Circle::grow");
  for (const auto& c : ctx.chunks) {
    EXPECT_NE(c.kind, ChunkKind::kClass) << c.chunk.text;
    EXPECT_EQ(c.chunk.text.find(hidden), std::string::npos) << c.name;
  }
}

TEST(WorkspaceContext, ACallJustTypedInTheBufferIsResolvedBeforeTheFileIsSaved) {
  Planted p = plant("buffer");
  Workspace ws(p.dir);
  ws.refresh();
  // On disk report() does not call unused_helper... which is file-local to shapes.cpp, so it stays invisible from
  // main.cpp; geo::scale typed anew in a new function is found.
  const std::string before = "#include \"geo/shapes.h\"\ndouble fresh(double v) {\n  double w = geo::scale(v, 2);\n  ";
  const auto ctx = workspace::context_at(*ws.graph(), "app/new.cpp", before, "\n  return geo::unused_helper(w);\n}\n");
  EXPECT_EQ(ctx.function, "fresh");
  std::set<std::string> callees;
  for (const auto& c : ctx.chunks)
    if (c.kind == ChunkKind::kCallee) callees.insert(c.name);
  EXPECT_EQ(callees, std::set<std::string>{"geo::scale"});
}

// Outside every function (a declaration, the include block) only the included headers' outlines come; a header the
// window's lines do not include still counts when the file on disk includes it (a window cut below its #includes).
TEST(WorkspaceContext, NoFunctionAtTheCursorGetsOnlyTheIncludedHeaders) {
  Planted p = plant("none");
  Workspace ws(p.dir);
  ws.refresh();
  auto ctx = workspace::context_at(*ws.graph(), "app/main.cpp", "#include \"geo/shapes.h\"\n", "\nint x;\n");
  EXPECT_EQ(ctx.function, "");
  ASSERT_EQ(ctx.chunks.size(), 1u);
  EXPECT_EQ(ctx.chunks[0].kind, ChunkKind::kInclude);
  EXPECT_EQ(ctx.chunks[0].name, "geo/shapes.h");
  ctx = workspace::context_at(*ws.graph(), "app/main.cpp", "int y;\n", "\nint x;\n");  // main.cpp on disk includes it
  ASSERT_EQ(ctx.chunks.size(), 1u);
  EXPECT_EQ(ctx.chunks[0].name, "geo/shapes.h");
  ctx = workspace::context_at(*ws.graph(), "app/other.cpp", "int y;\n", "\nint x;\n");  // no such file, no include
  EXPECT_TRUE(ctx.chunks.empty());
}

// A window that starts inside a long function: its head comes from the file on disk, so the function (and its
// callees) are found; without the file on disk there is no function.
TEST(WorkspaceContext, AWindowCutInsideAFunctionGetsItsHeadFromDisk) {
  Planted p = plant("head");
  Workspace ws(p.dir);
  ws.refresh();
  // report()'s body from "  c.grow(2);" on: the window holds neither its signature nor the #include lines.
  const std::string before = "  c.grow(2);\n  double a = c.area();\n  ";
  auto ctx = workspace::context_at(*ws.graph(), "app/main.cpp", before, kMainAfter);
  EXPECT_EQ(ctx.function, "report");
  EXPECT_EQ(kinds_and_names(ctx), kReportContext);
  ctx = workspace::context_at(*ws.graph(), "app/elsewhere.cpp", before, kMainAfter);
  EXPECT_EQ(ctx.function, "");
}

TEST(WorkspaceContext, TheBudgetKeepsTheBestChunks) {
  Planted p = plant("budget");
  Workspace ws(p.dir);
  ws.refresh();
  workspace::ContextOptions o;
  o.max_chunks = 1;
  const auto ctx = workspace::context_at(*ws.graph(), "app/main.cpp", std::string(kMainBefore) + "  ", kMainAfter, o);
  ASSERT_EQ(ctx.chunks.size(), 1u);
  EXPECT_EQ(ctx.chunks[0].name, "geo::Circle::area");
  o.max_chunks = 16;
  o.max_chunk_lines = 1;
  for (const auto& c : workspace::context_at(*ws.graph(), "app/main.cpp", kMainBefore, kMainAfter, o).chunks)
    EXPECT_EQ(std::count(c.chunk.text.begin(), c.chunk.text.end(), '\n'), 1) << c.name;
}

TEST(WorkspaceContext, MergeKeepsTheClientsChunksAndDropsRepeats) {
  std::vector<text::InfillChunk> client = {{"a.cpp", "int a() { return 1; }\nint b();\n"},
                                           {"a.cpp", "int a() { return 1; }\nint b();\n"}};
  std::vector<workspace::ContextChunk> ours = {{{"a.cpp", "int a() { return 1; }\n"}, ChunkKind::kCallee, "a", 1},
                                               {{"c.cpp", "int c() { return 3; }\n"}, ChunkKind::kCallee, "c", 1}};
  size_t dup = 0;
  std::vector<bool> kept;
  const auto merged = workspace::merge_chunks(client, ours, &dup, &kept);
  EXPECT_EQ(kept, (std::vector<bool>{false, true}));
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].filename, "a.cpp");
  EXPECT_EQ(merged[1].filename, "c.cpp");
  EXPECT_EQ(dup, 2u);
}

TEST(WorkspaceIndex, AFileEditedOnDiskIsParsedAgain) {
  Planted p = plant("edit");
  Workspace ws(p.dir);
  ws.refresh();
  EXPECT_EQ(ws.refresh(), 0u);  // nothing changed: nothing parsed, the same graph
  const auto before = ws.graph();
  write_file(p.dir + "/geo/shapes.cpp",
             std::string(kShapesCpp) + "namespace geo { double twice(double x) { return 2 * x; } }\n");
  EXPECT_EQ(ws.refresh(), 1u);
  const auto after = ws.graph();
  EXPECT_NE(before, after);
  auto has = [](const data::CallGraph& g, const std::string& q) {
    return std::any_of(g.functions.begin(), g.functions.end(), [&](const auto& f) { return f.qualified() == q; });
  };
  EXPECT_FALSE(has(before->graph(), "geo::twice"));
  EXPECT_TRUE(has(after->graph(), "geo::twice"));
  ::unlink((p.dir + "/geo/shapes.cpp").c_str());
  EXPECT_EQ(ws.refresh(), 1u);
  EXPECT_FALSE(has(ws.graph()->graph(), "geo::twice"));
  EXPECT_EQ(ws.status().files, 2u);
}

TEST(WorkspaceIndex, TheIndexingThreadFindsAnEditWhenPoked) {
  Planted p = plant("thread");
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> lines;
  Workspace ws(p.dir, {}, [&](const std::string& l) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(l);
    cv.notify_all();
  });
  ws.start(3600);  // a poll far away: only the first scan and the poke refresh
  auto wait_for_lines = [&](size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return lines.size() >= n; });
  };
  ASSERT_TRUE(wait_for_lines(1));
  EXPECT_NE(lines[0].find("3 files changed"), std::string::npos) << lines[0];
  write_file(p.dir + "/app/extra.cpp", "int extra() { return 1; }\n");
  ws.poke();
  ASSERT_TRUE(wait_for_lines(2));
  EXPECT_NE(lines[1].find("1 files changed; 4 files"), std::string::npos) << lines[1];
}

TEST(WorkspaceIndex, PathsOutsideTheWorkspaceAndSymlinksAreRefused) {
  Planted p = plant("paths");
  const std::string outside = fresh_dir("outside");
  write_file(outside + "/secret.cpp", "int secret() { return 42; }\n");
  ASSERT_EQ(::symlink((outside + "/secret.cpp").c_str(), (p.dir + "/app/link.cpp").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (p.dir + "/linked_dir").c_str()), 0);
  Workspace ws(p.dir);
  ws.refresh();
  std::string why;
  EXPECT_EQ(ws.relative("app/main.cpp", &why), "app/main.cpp");
  EXPECT_EQ(ws.relative(ws.root() + "/geo/./shapes.h", &why), "geo/shapes.h");
  EXPECT_EQ(ws.relative("app/unsaved.cpp", &why), "app/unsaved.cpp");  // a new buffer
  for (const std::string& bad :
       std::vector<std::string>{"../outside.cpp", "app/../../x.cpp", "/etc/passwd", outside + "/secret.cpp"}) {
    EXPECT_EQ(ws.relative(bad, &why), "") << bad;
    EXPECT_NE(why.find("outside the workspace"), std::string::npos) << bad << ": " << why;
  }
  for (const std::string link : {"app/link.cpp", "linked_dir/secret.cpp"}) {
    EXPECT_EQ(ws.relative(link, &why), "") << link;
    EXPECT_NE(why.find("symlink"), std::string::npos) << why;
  }
  // Neither symlink was followed by the index.
  for (const auto& f : ws.graph()->graph().functions) EXPECT_NE(f.name, "secret");
  EXPECT_EQ(ws.status().files, 3u);
}

TEST(WorkspaceIndex, HugeAndUnparsableFilesAreSkippedWithALogLine) {
  Planted p = plant("skip");
  write_file(p.dir + "/big.cpp", std::string(5000, ' ') + "int big() { return 1; }\n");
  write_file(p.dir + "/blob.h", std::string("\x7f"
                                            "ELF\x02\x01\x01\0\0\0",
                                            10) +
                                    std::string(100, '\xff'));
  std::vector<std::string> lines;
  workspace::WorkspaceLimits limits;
  limits.max_file_bytes = 4096;
  Workspace ws(p.dir, limits, [&](const std::string& l) { lines.push_back(l); });
  ws.refresh();
  auto logged = [&](const std::string& file, const std::string& why) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(file + ": skipped: " + why) != std::string::npos; });
  };
  EXPECT_TRUE(logged("big.cpp", "larger than 4096 bytes"));
  EXPECT_TRUE(logged("blob.h", "not UTF-8 text"));
  EXPECT_EQ(ws.status().files, 3u);
  EXPECT_EQ(ws.status().skipped, 2u);
  EXPECT_TRUE(ws.status().ready);
  EXPECT_THROW(Workspace(p.dir + "/no-such-dir"), Error);
}

}  // namespace
}  // namespace slm::test
