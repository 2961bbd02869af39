#pragma once
// C++ call graphs from source trees, for the Callers -> Target -> Callees documents (graph_docs.h).
// Every C++ file under a directory is parsed with tree-sitter (the tree-sitter-cpp grammar on Debian's
// libtree-sitter runtime); function definitions are indexed by qualified name and parameter count, and each
// call site is resolved by name with the rules in docs/context-graphs.md (scopes, using-directives, member
// calls on `this`, typed locals and fields, arity). No types are checked and macros are not expanded, so the
// graph approximates the real one: virtual calls go to the static type, same-arity overloads are all linked.
#include <cstdint>
#include <memory>
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
  uint32_t last_line() const;  // the line of the definition's end (its closing brace)
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

// A class, struct or union definition (one with a body).
struct ClassDef {
  std::string qualified;  // "geo::Circle"
  std::string file;       // path relative to the source root
  uint32_t line = 0;      // 1-based line where it (with its template header) starts
  std::string text;       // its source, from the template header or class key to the closing brace
};

// What one file contributes to a graph: its definitions and call sites, unresolved. A graph parses every file once
// and then links them (resolves the calls over all files); an index that keeps these links again when some files
// change without parsing the others (workspace/workspace.h).
struct FileFacts;  // call sites, usings and the rest the linker needs (callgraph.cpp)
struct ParsedFile {
  std::string path;  // relative to the source root
  uint64_t bytes = 0;
  bool has_errors = false;                 // parsed with some ERROR nodes
  std::string skipped;                     // "" when parsed, else why not (the graph's warning)
  std::shared_ptr<const FileFacts> facts;  // null when skipped
  // A header's (.h .hh .hpp .hxx .h++ .ipp .inl .tcc) first kHeadLines lines after its leading comments and blank
  // lines (a license), at most kHeadBytes: what an includer sees first of it. Empty for a source file.
  std::string head;
  static constexpr size_t kHeadLines = 64, kHeadBytes = 8192;
  const std::vector<FunctionInfo>& functions() const;
  const std::vector<std::string>& includes() const;  // "a/b.h" of #include "a/b.h" or <a/b.h>
};

// Parses files one by one with the options' limits (size, error share, parse time per file and in all).
class CppFileParser {
 public:
  explicit CppFileParser(CallGraphOptions options = {});
  ~CppFileParser();
  CppFileParser(const CppFileParser&) = delete;
  CppFileParser& operator=(const CppFileParser&) = delete;
  ParsedFile parse(const std::string& rel, const std::string& src);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ResolvedCall {
  uint32_t function = 0;  // index into the graph's functions
  uint32_t line = 0;      // of the call, in the caller's file
};

// Parsed files linked into a graph; it can also resolve the calls of a file it does not hold (an editor's buffer,
// parsed under its path) with the same rules against the graph's functions.
class LinkedGraph {
 public:
  explicit LinkedGraph(std::vector<std::shared_ptr<const ParsedFile>> files);
  ~LinkedGraph();
  LinkedGraph(const LinkedGraph&) = delete;
  LinkedGraph& operator=(const LinkedGraph&) = delete;
  const CallGraph& graph() const;
  CallGraph release();  // the graph, moved out (the object is then only to be destroyed)
  const std::vector<std::shared_ptr<const ParsedFile>>& files() const;
  const ClassDef* find_class(const std::string& qualified) const;  // the first definition, in file order
  const ParsedFile* file(const std::string& path) const;           // null when the graph holds no such file
  // The graph's functions (indices) defined in the file of this path, in file order.
  std::vector<uint32_t> functions_of(const std::string& path) const;
  // The header of the graph that `#include "include"` names (include_names), the shortest path when several do,
  // leaving out `except` (the includer itself); null when none.
  const ParsedFile* header_for(const std::string& include, const std::string& except) const;
  // The graph's functions that function `fn` of `buffer` calls, each once with the line of its first call, in the
  // order of their first calls, resolved as if the buffer replaced the graph's file of its path.
  std::vector<ResolvedCall> resolve_calls(const ParsedFile& buffer, size_t fn) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Does an #include path name this file (relative to a source root)? Either may hold more leading directories than
// the other: "boost/graph/x.hpp" vs "x.hpp", "../include/a.h" vs "include/a.h".
bool include_names(const std::string& file, const std::string& include);

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
