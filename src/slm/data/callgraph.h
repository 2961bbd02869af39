#pragma once
// C++ call graphs from source trees, for the Callers -> Target -> Callees documents (graph_docs.h).
// Every C++ file under a directory is parsed with tree-sitter (the tree-sitter-cpp grammar on Debian's
// libtree-sitter runtime); function definitions are indexed by qualified name and parameter count, and each
// call site is resolved by name with the rules in docs/context-graphs.md (scopes, using-directives, member
// calls on `this`, typed locals and fields, arity). No types are checked and macros are not expanded, so the
// graph approximates the real one: virtual calls go to the static type, same-arity overloads are all linked.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "slm/util/progress.h"

namespace slm::data {

struct FunctionInfo {
  std::string name;         // unqualified: "area", "operator+", "Circle" (a constructor), "~Circle"
  std::string scope;        // enclosing namespaces and classes, "geo::Circle"; "" at global scope
  int min_args = 0;         // parameters without defaults
  int max_args = 0;         // all parameters; kVariadic for "..." and parameter packs
  bool is_method = false;   // defined in (or for) a class
  bool file_local = false;  // static at namespace scope, or in an anonymous namespace: only its file calls it
  std::string file;         // path relative to the source root
  uint32_t line = 0;        // 1-based line where the definition (with its template header) starts
  std::string text;         // the definition's source: leading comments, template header, body

  static constexpr int kVariadic = 1 << 20;
  std::string qualified() const { return scope.empty() ? name : scope + "::" + name; }
  // "util::add(2)"; with defaults "f(1-2)"; variadic "f(1+)". Two definitions can share a signature (same
  // arity, different types, or file-local functions of different files).
  std::string signature() const;
  bool accepts(int args) const { return args >= min_args && args <= max_args; }
};

struct CallGraph {
  std::vector<FunctionInfo> functions;
  // Per function: the functions it calls / that call it (indices, sorted, unique; recursion is a self edge).
  std::vector<std::vector<uint32_t>> callees, callers;
  uint64_t files = 0, bytes = 0;   // parsed
  uint64_t files_skipped = 0;      // unreadable, binary, too large, or mostly unparseable (see warnings)
  uint64_t files_with_errors = 0;  // parsed with some ERROR nodes (usually macros); their functions are kept
  uint64_t call_sites = 0, resolved_call_sites = 0;
  uint64_t ambiguous_call_sites = 0;  // more than 4 definitions fit even after preferring included files
  std::vector<std::string> warnings;  // one per skipped file, naming it and why

  uint64_t edge_count() const;
};

struct CallGraphOptions {
  std::string src_dir;
  uint64_t max_file_bytes = 2'000'000;  // larger files are skipped (generated tables)
  // A file is skipped as unparseable when more of its token bytes than this are syntax errors and it yields no
  // function definition.
  double max_error_fraction = 0.5;
  std::vector<std::string> exclude;  // skip paths containing any of these substrings
  // tree-sitter's error recovery can take minutes on a pathological file (deep macro soup): a file's parse stops
  // after parse_ms_base + parse_ms_per_mb per MB of its size and the file is skipped, and once a graph has spent
  // time_budget_s (0 = no limit) on parsing, its remaining files are skipped, each with a warning.
  uint64_t parse_ms_base = 2000, parse_ms_per_mb = 4000;
  double time_budget_s = 0;
};

// Is this a C++ source or header name (.cc .cpp .cxx .c++ .C .h .hh .hpp .hxx .h++ .ipp .inl .tcc)?
bool is_cpp_source_name(const std::string& path);

// Parses every C++ file under options.src_dir (sorted, so the graph is deterministic). Throws slm::Error when
// the directory is missing or holds no C++ files; a file that cannot be used is skipped with a warning.
// progress reports bytes.
CallGraph build_call_graph(const CallGraphOptions& options, const ProgressFn& progress = {});

// The same from in-memory files (relative path, text), for tests and tools.
CallGraph build_call_graph(const std::vector<std::pair<std::string, std::string>>& files,
                           const CallGraphOptions& options = {});

}  // namespace slm::data
