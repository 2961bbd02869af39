#include "slm/server/file_type.h"

#include <array>
#include <cctype>

namespace slm::server {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

size_t count(std::string_view text, std::string_view needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string_view::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// Lines that start (after indentation) with one of these followed by "(" are CMake: none of them is a C++ or shell
// idiom.
constexpr std::array<std::string_view, 12> kCmakeCommands = {"cmake_minimum_required",
                                                             "add_executable",
                                                             "add_library",
                                                             "target_link_libraries",
                                                             "find_package",
                                                             "project",
                                                             "set",
                                                             "target_include_directories",
                                                             "add_subdirectory",
                                                             "include_directories",
                                                             "target_compile_options",
                                                             "add_test"};

size_t cmake_commands(std::string_view text) {
  size_t n = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    for (const auto& c : kCmakeCommands)
      if (line.size() > c.size() && line.substr(0, c.size()) == c &&
          (line[c.size()] == '(' || (line[c.size()] == ' ' && line.find('(') == c.size() + 1)))
        ++n;
    start = end + 1;
  }
  return n;
}

}  // namespace

std::string file_type_of_name(std::string_view path) {
  const size_t slash = path.find_last_of("/\\");
  const std::string name = lower(slash == std::string_view::npos ? path : path.substr(slash + 1));
  if (name == "cmakelists.txt") return "cmake";
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return "";
  const std::string ext = name.substr(dot + 1);
  for (const char* e : {"cpp", "cc", "cxx", "c++", "h", "hpp", "hh", "hxx", "ipp", "tpp", "inl"})
    if (ext == e) return "cpp";
  if (ext == "cmake") return "cmake";
  if (ext == "sh" || ext == "bash") return "shell";
  return "";
}

std::string file_type_of_text(std::string_view text) {
  if (text.substr(0, 2) == "#!") {
    const std::string_view first = text.substr(0, text.find('\n'));
    for (const char* sh : {"sh", "bash", "dash", "ksh", "zsh"}) {
      // The interpreter is the path's last component (#!/bin/bash) or env's argument (#!/usr/bin/env bash).
      const std::string s = sh;
      for (const std::string& form : {"/" + s, " " + s})
        for (size_t at = first.find(form); at != std::string_view::npos; at = first.find(form, at + 1)) {
          const size_t after = at + form.size();
          if (after == first.size() || first[after] == ' ' || first[after] == '\r') return "shell";
        }
    }
  }
  const size_t cmake = cmake_commands(text);
  size_t cpp = 0;
  for (std::string_view m : {"#include", "std::", "namespace ", "template <", "template<", "class ", "struct ",
                             "public:", "private:", "nullptr", "constexpr"})
    cpp += count(text, m);
  if (cmake >= 2 && cmake > cpp) return "cmake";
  if (cpp >= 2 && cpp > cmake) return "cpp";
  return "";
}

}  // namespace slm::server
