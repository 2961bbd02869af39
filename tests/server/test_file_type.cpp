// The file-type table of an editor's completion (src/slm/server/file_type.h): by name, then by text.
#include <gtest/gtest.h>

#include "slm/server/file_type.h"

namespace slm::server {
namespace {

TEST(FileType, ByName) {
  struct Case {
    const char* path;
    const char* type;
  };
  const Case cases[] = {
      {"src/a.cpp", "cpp"},
      {"a.cc", "cpp"},
      {"a.cxx", "cpp"},
      {"include/x/a.h", "cpp"},
      {"a.hpp", "cpp"},
      {"a.hh", "cpp"},
      {"detail/a.ipp", "cpp"},
      {"a.tpp", "cpp"},
      {"A.CPP", "cpp"},
      {"CMakeLists.txt", "cmake"},
      {"sub/CMakeLists.txt", "cmake"},
      {"cmake/FindFoo.cmake", "cmake"},
      {"run.sh", "shell"},
      {"lib.bash", "shell"},
      {"C:\\src\\win.cpp", "cpp"},
      {"README.md", ""},
      {"Makefile", ""},
      {"notes.txt", ""},
      {"", ""},
      {"cpp", ""},
      {"a.cpp.orig", ""},
  };
  for (const auto& c : cases) EXPECT_EQ(file_type_of_name(c.path), c.type) << c.path;
}

TEST(FileType, ByText) {
  EXPECT_EQ(file_type_of_text("#!/bin/bash\nset -e\n"), "shell");
  EXPECT_EQ(file_type_of_text("#!/usr/bin/env sh\necho hi\n"), "shell");
  EXPECT_EQ(file_type_of_text("#!/usr/bin/env zsh"), "shell");
  EXPECT_EQ(file_type_of_text("#!/usr/bin/env python3\nimport os\n"), "");  // a shebang of another interpreter
  EXPECT_EQ(file_type_of_text("#!/bin/bashful\n"), "");
  EXPECT_EQ(file_type_of_text("cmake_minimum_required(VERSION 3.20)\nproject(x CXX)\nadd_executable(x main.cpp)\n"),
            "cmake");
  EXPECT_EQ(file_type_of_text("#include <vector>\nnamespace a {\nstd::vector<int> v;\n}\n"), "cpp");
  EXPECT_EQ(file_type_of_text("template <class T>\nstruct S {\n public:\n  T x;\n};\n"), "cpp");
  // One marker is not enough to tell; nothing at all tells nothing.
  EXPECT_EQ(file_type_of_text("set(X 1)\n"), "");
  EXPECT_EQ(file_type_of_text("hello world\n"), "");
  EXPECT_EQ(file_type_of_text(""), "");
}

}  // namespace
}  // namespace slm::server
