#pragma once
// A user's repository as the server sees it (`slm serve --workspace DIR`, issue 45): the C++ files under DIR parsed
// with the call-graph extraction of `slm data graphs` (data/callgraph.h) and linked into one graph, and its CMake files
// (CMakeLists.txt, *.cmake) read into a CMake index (cmake_index.h), both kept fresh by re-parsing a file whose size or
// modification time changed; cursor_context.h and CMakeIndex::context_at rank what of them a completion sees.
//
// Safe by default: only regular files under the root are read; symlinks (to files or directories) are not followed,
// hidden directories (.git, .cache) are not entered, and the budgets below bound a workspace's memory and time. A
// request names a file by a path relative to the root or an absolute path under it; `relative` refuses anything
// else (a path with "..", a symlink out, a file outside). Nothing is written and nothing is sent anywhere.
//
// Threads: one indexing thread (start) or the caller (refresh) parses and links; requests read the latest linked
// graph through graph(), a shared pointer swapped under a mutex, so a request never waits for a parse.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slm/data/callgraph.h"
#include "slm/workspace/cmake_index.h"

namespace slm::workspace {

struct WorkspaceLimits {
  uint64_t max_file_bytes = 1u << 20;  // larger files are skipped (generated tables, amalgamations)
  uint64_t max_files = 50'000;         // C++ and CMake files past this many (in path order) are skipped
  uint64_t max_bytes = 512ull << 20;   // and past this many bytes in all
  // tree-sitter's time per file (data/callgraph.h) and the parse time of one refresh: files left over are parsed by
  // the next refresh, so a huge tree becomes complete over several rounds instead of holding the index.
  uint64_t parse_ms_base = 2000, parse_ms_per_mb = 4000;
  double refresh_budget_s = 60;
};

struct WorkspaceStatus {
  std::string root;
  bool ready = false;        // the first full scan is linked
  uint64_t files = 0;        // parsed C++ files in the graph
  uint64_t bytes = 0;        // their size
  uint64_t skipped = 0;      // C++ and CMake files left out (too large, binary, unparseable, over a budget)
  uint64_t pending = 0;      // C++ files waiting for a refresh (over the last one's time budget)
  uint64_t functions = 0;    // definitions in the graph
  uint64_t cmake_files = 0;  // CMake files in the CMake index
  uint64_t cmake_definitions = 0;  // their functions, macros and targets
  uint64_t refreshes = 0;    // scans done
  double index_seconds = 0;  // time spent parsing and linking, all scans
};

class Workspace {
 public:
  using Log = std::function<void(const std::string&)>;
  // root must be a directory (throws slm::Error otherwise); nothing is read until refresh() or start().
  explicit Workspace(const std::string& root, WorkspaceLimits limits = {}, Log log = {});
  ~Workspace();  // stops the indexing thread
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  const std::string& root() const { return root_; }  // canonical, without a trailing '/'
  const WorkspaceLimits& limits() const { return limits_; }
  // Scans the tree once: parses new and changed files, forgets removed ones, and links a new graph when anything
  // changed; returns the number of files parsed or forgotten. Logs each newly skipped file with why.
  size_t refresh();
  // Indexes on a thread of its own: a refresh now, then one every poll_s seconds until destruction.
  void start(double poll_s = 2.0);
  // Wakes the indexing thread for a refresh now (e.g. a request named a file the graph does not hold).
  void poke();

  std::shared_ptr<const data::LinkedGraph> graph() const;  // null until the first refresh has linked
  std::shared_ptr<const CMakeIndex> cmake() const;         // the same for the CMake files
  WorkspaceStatus status() const;

  // The path relative to the root of a request's filename (relative to the root, or absolute under it), or "" with
  // why when it leaves the root ("..", an absolute path elsewhere, a symlink anywhere on the way). The file need not
  // exist (an editor's new, unsaved buffer).
  std::string relative(const std::string& filename, std::string* why = nullptr) const;

 private:
  struct State;
  std::string root_;
  WorkspaceLimits limits_;
  Log log_;
  std::unique_ptr<State> state_;
};

}  // namespace slm::workspace
