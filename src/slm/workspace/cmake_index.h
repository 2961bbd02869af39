#pragma once
// The CMake files of a workspace (issue 45): what one CMakeLists.txt or .cmake file defines for the others, and the
// context a cursor in one gets, as cursor_context.h does for C++.
//
// A file is read as CMake's grammar has it (cmake-language(7)): command invocations `name(args)`, line comments,
// bracket comments and arguments (`#[[...]]`, `[=[...]=]`), quoted arguments with escapes, nested parentheses. It
// defines:
//   function / macro  `function(NAME ...)` ... `endfunction()`: the whole definition; command names are
//                     case-insensitive, so they are kept lowercased;
//   target            `add_library(NAME ...)`, `add_executable(NAME ...)`, `add_custom_target(NAME ...)`: the
//                     command with the file's `target_*(NAME ...)` and `set_target_properties(NAME ...)` commands
//                     after it, i.e. what a user of the target gets from it (its sources, usage requirements).
// A cursor's window (the text before and after it, parsed on its own) gets, best first: the definitions of the
// functions and macros it invokes that the window does not hold, the targets it names in any argument (a
// `target_link_libraries(app PRIVATE geo)` line gets geo's definition), then, for a cursor inside a function or macro
// definition, the lines of its callers' invocations, and the first lines of the modules it `include()`s that the
// workspace holds (`include(Warnings)` -> some `.../Warnings.cmake`).
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "slm/workspace/cursor_context.h"

namespace slm::workspace {

// CMakeLists.txt, or a name ending in .cmake.
bool is_cmake_name(const std::string& path);

struct CMakeCommand {
  std::string name;               // lowercased
  std::vector<std::string> args;  // unquoted; a bracket argument's content as is
  uint32_t line = 0;              // 1-based line of the name
  size_t begin = 0, end = 0;      // byte range of the invocation, the name to the closing ')'
};

// The command invocations of a text, in order; an invocation the text cuts off (a cursor inside it) ends at the end.
std::vector<CMakeCommand> parse_cmake_commands(const std::string& text);

struct CMakeDefinition {
  enum class Kind { kFunction, kTarget };
  Kind kind = Kind::kFunction;
  std::string name;  // a function's or macro's lowercased; a target's as written
  std::string file;  // relative to the workspace
  uint32_t line = 0;
  std::string text;  // whole lines
};

struct CMakeFile {
  std::string path;
  std::string text;  // the whole file (CMake files are small; callers' invocations are cut from it)
  std::vector<CMakeCommand> commands;
  std::vector<CMakeDefinition> definitions;
  std::string head;  // the first lines after its leading comments and blank lines (what an includer sees first)
};

CMakeFile parse_cmake_file(const std::string& path, const std::string& text);

// The CMake files of a workspace, linked: definitions by name, invocations by command name, modules by file name.
class CMakeIndex {
 public:
  explicit CMakeIndex(std::vector<std::shared_ptr<const CMakeFile>> files);
  const std::vector<std::shared_ptr<const CMakeFile>>& files() const { return files_; }
  size_t definitions() const;
  bool holds(const std::string& path) const { return paths_.count(path) > 0; }
  // The context of a cursor in the CMake file `path` (before/after as for context_at), within the same budget.
  CursorContext context_at(const std::string& path, const std::string& before, const std::string& after,
                           const ContextOptions& options = {}) const;

 private:
  std::vector<std::shared_ptr<const CMakeFile>> files_;
  std::set<std::string> paths_;
  std::multimap<std::string, const CMakeDefinition*> functions_, targets_;
  std::multimap<std::string, std::pair<const CMakeFile*, const CMakeCommand*>> calls_;  // by command name
  std::multimap<std::string, const CMakeFile*> modules_;                                // "warnings.cmake" -> files
};

}  // namespace slm::workspace
