#include "slm/eval/compile_pass.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <mutex>
#include <thread>

#include "slm/data/callgraph.h"
#include "slm/data/hashing.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::eval {

namespace {

namespace fs = std::filesystem;

// The body of a definition's text: the offsets of the last '{' at brace depth 0 whose matching '}' is the text's
// last non-blank character, and of that '}'; {npos, npos} when there is none (= default, = delete, a function-try
// block's handlers). Comments, string and character literals (raw strings too) are skipped; a ' after a digit is a
// digit separator.
std::pair<size_t, size_t> body_braces(const std::string& t) {
  constexpr size_t npos = std::string::npos;
  const size_t last = t.find_last_not_of(" \t\r\n");
  if (last == npos || t[last] != '}') return {npos, npos};
  int depth = 0;
  size_t open = npos;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '/' && i + 1 < t.size() && t[i + 1] == '/') {
      i = t.find('\n', i);
      if (i == npos) break;
    } else if (c == '/' && i + 1 < t.size() && t[i + 1] == '*') {
      i = t.find("*/", i + 2);
      if (i == npos) break;
      ++i;
    } else if (c == 'R' && i + 1 < t.size() && t[i + 1] == '"' &&
               (i == 0 || !std::isalnum(static_cast<unsigned char>(t[i - 1])))) {
      const size_t paren = t.find('(', i + 2);
      if (paren == npos) break;
      const std::string end = ")" + t.substr(i + 2, paren - i - 2) + "\"";
      i = t.find(end, paren);
      if (i == npos) break;
      i += end.size() - 1;
    } else if (c == '"' || (c == '\'' && (i == 0 || !std::isalnum(static_cast<unsigned char>(t[i - 1]))))) {
      for (++i; i < t.size() && t[i] != c; ++i)
        if (t[i] == '\\') ++i;
    } else if (c == '{') {
      if (depth++ == 0) open = i;
    } else if (c == '}') {
      if (--depth < 0) return {npos, npos};
      if (depth == 0 && i == last) return {open, i};
    }
  }
  return {npos, npos};
}

// Offset of the first character of 1-based line `line`.
size_t line_offset(const std::string& text, uint32_t line) {
  size_t at = 0;
  for (uint32_t l = 1; l < line && at != std::string::npos; ++l) {
    at = text.find('\n', at);
    if (at != std::string::npos) ++at;
  }
  return at == std::string::npos ? text.size() : at;
}

bool is_source_name(const std::string& path) {
  for (const char* ext : {".cc", ".cpp", ".cxx", ".c++", ".C"}) {
    const std::string e = ext;
    if (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

}  // namespace

std::optional<BodySplit> split_body(const std::string& t, const BodyCutOptions& options) {
  const auto [open, close] = body_braces(t);
  if (open == std::string::npos) return std::nullopt;
  const size_t open_end = t.find('\n', open);
  if (open_end == std::string::npos || open_end >= close || t.find_first_not_of(" \t\r", open + 1) != open_end)
    return std::nullopt;  // the '{' must end its line
  const size_t close_line = t.rfind('\n', close) + 1;
  if (close_line <= open_end + 1 || t.find_first_not_of(" \t", close_line) != close)
    return std::nullopt;  // the '}' must start its line, below the opening one
  BodySplit s;
  s.head_end = open_end + 1;
  s.close_line = close_line;
  s.body = t.substr(s.head_end, close_line - 1 - s.head_end);
  s.stop = "\n" + t.substr(close_line, close - close_line) + "}";
  const auto lines = static_cast<size_t>(std::count(s.body.begin(), s.body.end(), '\n')) + 1;
  if (lines < options.min_body_lines || s.body.size() > options.max_body_bytes ||
      s.body.find(s.stop) != std::string::npos)
    return std::nullopt;
  return s;
}

std::vector<BodyCut> cut_function_bodies(const std::string& name, const std::string& text, const std::string& dir,
                                         const BodyCutOptions& options) {
  data::CallGraphOptions go;
  go.max_file_bytes = std::max<uint64_t>(go.max_file_bytes, text.size());
  const auto graph = data::build_call_graph({{name, text}}, go);
  std::vector<BodyCut> cuts;
  for (const auto& f : graph.functions) {
    // The definition where the parser saw it: its text ends at or after the start of its line.
    const size_t start = text.rfind(f.text, line_offset(text, f.line + 1));
    if (start == std::string::npos) continue;
    const auto split = split_body(f.text, options);
    if (!split) continue;
    BodyCut c;
    c.problem.name = name + ":" + std::to_string(f.line) + ":" + f.qualified();
    c.problem.prompt = text.substr(0, start + split->head_end);
    c.problem.tests = text.substr(start + split->close_line);
    c.problem.stop_tokens = {split->stop};
    if (!dir.empty()) c.problem.quote_dirs = {dir};
    c.body = split->body;
    cuts.push_back(std::move(c));
  }
  if (cuts.size() > options.max_per_file) {
    // Spread the kept cuts over the file by a hash of their names, then restore the file's order.
    std::vector<std::pair<uint64_t, size_t>> order;
    for (size_t i = 0; i < cuts.size(); ++i) order.push_back({data::hash64(cuts[i].problem.name), i});
    std::sort(order.begin(), order.end());
    order.resize(options.max_per_file);
    std::vector<size_t> keep;
    for (const auto& [h, i] : order) keep.push_back(i);
    std::sort(keep.begin(), keep.end());
    std::vector<BodyCut> kept;
    for (size_t i : keep) kept.push_back(std::move(cuts[i]));
    cuts = std::move(kept);
  }
  return cuts;
}

std::vector<BodyCut> cut_source_tree(const std::string& root_dir, size_t max_files, const BodyCutOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(root_dir, ec)) throw Error("compile-pass: " + root_dir + " is not a directory");
  const std::string root = fs::absolute(root_dir, ec).lexically_normal().string();  // the judge compiles elsewhere
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec) && is_source_name(it->path().string())) files.push_back(it->path().string());
  if (files.empty()) throw Error("compile-pass: no C++ source file (.cc .cpp .cxx .c++ .C) under " + root_dir);
  std::sort(files.begin(), files.end());
  if (max_files > 0 && files.size() > max_files) files.resize(max_files);
  std::vector<BodyCut> cuts;
  for (const auto& path : files) {
    const std::string rel = fs::path(path).lexically_relative(root).string();
    for (auto& c : cut_function_bodies(rel, read_file(path), fs::path(path).parent_path().string(), options))
      cuts.push_back(std::move(c));
  }
  return cuts;
}

std::vector<BodyCut> keep_compiling(std::vector<BodyCut> cuts, Judge& judge, int jobs,
                                    const std::function<void(size_t, size_t)>& progress) {
  std::vector<char> ok(cuts.size(), 0);
  std::atomic<size_t> next{0}, done{0};
  std::mutex mu;
  auto work = [&] {
    for (size_t i; (i = next++) < cuts.size();) {
      ok[i] = judge.judge(cuts[i].problem, cuts[i].body).outcome == Outcome::kPassed;
      const size_t d = ++done;
      if (progress) {
        std::lock_guard lock(mu);
        progress(d, cuts.size());
      }
    }
  };
  std::vector<std::thread> workers;
  const int n = std::max(1, jobs > 0 ? jobs : static_cast<int>(std::thread::hardware_concurrency()));
  for (int t = 0; t < n; ++t) workers.emplace_back(work);
  for (auto& w : workers) w.join();
  std::vector<BodyCut> kept;
  for (size_t i = 0; i < cuts.size(); ++i)
    if (ok[i]) kept.push_back(std::move(cuts[i]));
  return kept;
}

}  // namespace slm::eval
