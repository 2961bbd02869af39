// The CMake files of a workspace (issue 45, workspace/cmake_index.h): the commands as cmake-language(7) reads them,
// what a file defines, and the context a cursor in a CMake file gets, each against hand-listed values from the
// planted files below.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "slm/workspace/cmake_index.h"
#include "slm/workspace/workspace.h"

namespace slm::test {
namespace {

using workspace::ChunkKind;
using workspace::CMakeDefinition;

TEST(CMakeIndex, CommandsAreReadAsCMakesGrammarHasThem) {
  const std::string text =
      "cmake_minimum_required(VERSION 3.20) # a comment (with parens)\n"  // 1
      "#[[ a bracket comment\n"                                           // 2
      "add_library(not_me) ]]\n"                                          // 3
      "SET(msg \"a \\\"quoted\\\" (paren\" [=[bracket ] arg]=])\n"        // 4
      "if((A AND B) OR C)\n"                                              // 5
      "  message(STATUS\n"                                                // 6
      "          ${msg})\n"                                               // 7
      "endif()\n"                                                         // 8
      "target_link_libraries(app PRIVATE geo";                            // 9, cut off by the cursor
  const auto cmds = workspace::parse_cmake_commands(text);
  ASSERT_EQ(cmds.size(), 6u);
  EXPECT_EQ(cmds[0].name, "cmake_minimum_required");
  EXPECT_EQ(cmds[0].args, (std::vector<std::string>{"VERSION", "3.20"}));
  EXPECT_EQ(cmds[1].name, "set");  // lowercased; the bracket comment's add_library is no command
  EXPECT_EQ(cmds[1].line, 4u);
  EXPECT_EQ(cmds[1].args, (std::vector<std::string>{"msg", "a \"quoted\" (paren", "bracket ] arg"}));
  EXPECT_EQ(cmds[2].name, "if");
  EXPECT_EQ(cmds[2].args, (std::vector<std::string>{"A", "AND", "B", "OR", "C"}));
  EXPECT_EQ(cmds[3].name, "message");
  EXPECT_EQ(cmds[3].line, 6u);
  EXPECT_EQ(cmds[3].args, (std::vector<std::string>{"STATUS", "${msg}"}));
  EXPECT_EQ(cmds[4].name, "endif");
  EXPECT_TRUE(cmds[4].args.empty());
  EXPECT_EQ(cmds[5].line, 9u);
  EXPECT_EQ(cmds[5].args, (std::vector<std::string>{"app", "PRIVATE", "geo"}));
  EXPECT_EQ(text.substr(cmds[3].begin, cmds[3].end - cmds[3].begin), "message(STATUS\n          ${msg})");
}

// The planted project: a module with a function, a library with its usage requirements, an app that uses both.
const char* kWarnings =
    "# Warnings.cmake: compiler warnings for a target.\n"
    "\n"
    "function(enable_warnings target)\n"
    "  target_compile_options(${target} PRIVATE -Wall)\n"
    "endfunction()\n";
const char* kRoot =
    "cmake_minimum_required(VERSION 3.20)\n"
    "project(shapes CXX)\n"
    "include(cmake/Warnings.cmake)\n"
    "add_subdirectory(geo)\n"
    "add_subdirectory(app)\n";
const char* kGeo =
    "add_library(geo shapes.cpp)\n"
    "set(unrelated 1)\n"
    "target_include_directories(geo PUBLIC\n"
    "  ${CMAKE_CURRENT_SOURCE_DIR}/include)\n"
    "enable_warnings(geo)\n";
const char* kAppBefore =
    "add_executable(app main.cpp)\n"
    "target_link_libraries(app PRIVATE geo)\n";
const char* kAppAfter = "\n";

TEST(CMakeIndex, AFileDefinesItsFunctionsAndTargetsWithTheirUsageRequirements) {
  const auto f = workspace::parse_cmake_file("geo/CMakeLists.txt", kGeo);
  ASSERT_EQ(f.definitions.size(), 1u);
  EXPECT_EQ(f.definitions[0].kind, CMakeDefinition::Kind::kTarget);
  EXPECT_EQ(f.definitions[0].name, "geo");
  EXPECT_EQ(f.definitions[0].line, 1u);
  // Its command and the target_* commands naming it, not the other lines.
  EXPECT_EQ(f.definitions[0].text,
            "add_library(geo shapes.cpp)\n"
            "target_include_directories(geo PUBLIC\n"
            "  ${CMAKE_CURRENT_SOURCE_DIR}/include)\n");
  const auto w = workspace::parse_cmake_file("cmake/Warnings.cmake", kWarnings);
  ASSERT_EQ(w.definitions.size(), 1u);
  EXPECT_EQ(w.definitions[0].kind, CMakeDefinition::Kind::kFunction);
  EXPECT_EQ(w.definitions[0].name, "enable_warnings");
  EXPECT_EQ(w.definitions[0].line, 3u);
  EXPECT_EQ(w.definitions[0].text,
            "function(enable_warnings target)\n  target_compile_options(${target} PRIVATE -Wall)\nendfunction()\n");
  EXPECT_EQ(w.head,
            "function(enable_warnings target)\n  target_compile_options(${target} PRIVATE -Wall)\n"
            "endfunction()\n");  // the leading comment and blank line left out
  EXPECT_TRUE(workspace::is_cmake_name("CMakeLists.txt"));
  EXPECT_TRUE(workspace::is_cmake_name("a/b/CMakeLists.txt"));
  EXPECT_TRUE(workspace::is_cmake_name("cmake/Warnings.cmake"));
  EXPECT_FALSE(workspace::is_cmake_name("CMakeLists.txt.in"));
  EXPECT_FALSE(workspace::is_cmake_name("main.cpp"));
}

TEST(CMakeIndex, ACursorGetsTheFunctionsItCallsTheTargetsItNamesAndTheCallersOfItsFunction) {
  const std::string dir = fresh_dir("cmake_ctx");
  write_file(dir + "/cmake/Warnings.cmake", kWarnings);
  write_file(dir + "/CMakeLists.txt", kRoot);
  write_file(dir + "/geo/CMakeLists.txt", kGeo);
  write_file(dir + "/app/CMakeLists.txt", std::string(kAppBefore) + kAppAfter);
  workspace::Workspace ws(dir);
  ws.refresh();
  const auto idx = ws.cmake();
  ASSERT_TRUE(idx);
  EXPECT_EQ(ws.status().cmake_files, 4u);
  EXPECT_EQ(ws.status().cmake_definitions, 3u);  // enable_warnings, geo, app
  EXPECT_TRUE(idx->holds("geo/CMakeLists.txt"));

  // Writing app's next line: the window names geo (a target of geo/) and app (its own); then enable_warnings( is
  // typed: its definition comes too, nearest the cursor.
  auto ctx = idx->context_at("app/CMakeLists.txt", std::string(kAppBefore) + "enable_warnings(", ")\n");
  ASSERT_EQ(ctx.chunks.size(), 2u);
  EXPECT_EQ(ctx.chunks[0].kind, ChunkKind::kTarget);  // oldest first: the target, then the callee
  EXPECT_EQ(ctx.chunks[0].name, "geo");
  EXPECT_EQ(ctx.chunks[0].chunk.filename, "geo/CMakeLists.txt");
  EXPECT_EQ(ctx.chunks[0].line, 1u);
  EXPECT_EQ(ctx.chunks[1].kind, ChunkKind::kCallee);
  EXPECT_EQ(ctx.chunks[1].name, "enable_warnings");
  EXPECT_EQ(ctx.chunks[1].chunk.filename, "cmake/Warnings.cmake");
  EXPECT_EQ(ctx.chunks[1].chunk.text,
            "function(enable_warnings target)\n  target_compile_options(${target} PRIVATE -Wall)\nendfunction()\n");
  EXPECT_EQ(ctx.function, "");

  // Inside the function's body: geo's invocation of it is a caller; the root's include gives no chunk here (the
  // window is the module itself).
  ctx = idx->context_at("cmake/Warnings.cmake", "function(enable_warnings target)\n  ",
                        "\n  target_compile_options(${target} PRIVATE -Wall)\nendfunction()\n");
  EXPECT_EQ(ctx.function, "enable_warnings");
  ASSERT_EQ(ctx.chunks.size(), 1u);
  EXPECT_EQ(ctx.chunks[0].kind, ChunkKind::kCaller);
  EXPECT_EQ(ctx.chunks[0].chunk.filename, "geo/CMakeLists.txt");
  EXPECT_EQ(ctx.chunks[0].chunk.text, "enable_warnings(geo)\n");
  EXPECT_EQ(ctx.chunks[0].line, 5u);

  // The root file: include() of a module of the workspace gives its first lines; add_subdirectory(geo) and (app) name
  // words that are targets too, so their definitions come, the nearest to the cursor (app, line 5) last.
  ctx = idx->context_at("CMakeLists.txt", kRoot, "");
  ASSERT_EQ(ctx.chunks.size(), 3u);
  EXPECT_EQ(ctx.chunks[0].kind, ChunkKind::kInclude);
  EXPECT_EQ(ctx.chunks[0].chunk.filename, "cmake/Warnings.cmake");
  EXPECT_EQ(ctx.chunks[0].chunk.text.rfind("function(enable_warnings target)\n", 0), 0u);
  EXPECT_EQ(ctx.chunks[1].name, "geo");
  EXPECT_EQ(ctx.chunks[2].name, "app");
  EXPECT_EQ(ctx.chunks[2].chunk.text, "add_executable(app main.cpp)\ntarget_link_libraries(app PRIVATE geo)\n");

  // An edit on disk is read again: geo's target gains a dependency.
  write_file(dir + "/geo/CMakeLists.txt", std::string(kGeo) + "target_link_libraries(geo PUBLIC m)\n");
  ws.refresh();
  ctx = ws.cmake()->context_at("app/CMakeLists.txt", kAppBefore, kAppAfter);
  ASSERT_EQ(ctx.chunks.size(), 1u);
  EXPECT_NE(ctx.chunks[0].chunk.text.find("target_link_libraries(geo PUBLIC m)"), std::string::npos)
      << ctx.chunks[0].chunk.text;
}

}  // namespace
}  // namespace slm::test
