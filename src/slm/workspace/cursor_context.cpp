#include "slm/workspace/cursor_context.h"

#include <algorithm>
#include <cstdlib>
#include <functional>

namespace slm::workspace {

namespace {

size_t count_lines(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

std::string with_newline(std::string s) {
  if (!s.empty() && s.back() != '\n') s += '\n';
  return s;
}

// The outline (first lines after the license) of each workspace header the buffer (or the file on disk) includes, up
// to max_includes.
void add_include_outlines(const data::LinkedGraph& graph, const data::ParsedFile& buffer, const std::string& path,
                          const std::function<bool(const std::string&)>& in_window, const ContextOptions& o,
                          std::vector<ContextChunk>& ranked) {
  // The buffer's includes, then those of the workspace's copy of the file (a window cut below its #include lines).
  std::vector<std::string> incs = buffer.includes();
  if (const data::ParsedFile* disk = graph.file(path))
    for (const std::string& inc : disk->includes())
      if (std::find(incs.begin(), incs.end(), inc) == incs.end()) incs.push_back(inc);
  size_t includes = 0;
  for (const std::string& inc : incs) {
    if (includes == o.max_includes) break;
    const data::ParsedFile* best = graph.header_for(inc, path);
    if (!best || in_window(best->head)) continue;
    ranked.push_back(
        {{best->path, with_newline(line_range(best->head, 0, o.max_chunk_lines))}, ChunkKind::kInclude, best->path, 0});
    ++includes;
  }
}

// The lines before the window of the workspace's definition (in the file of `path`, on disk) that holds the window's
// first three lines (whole lines before the cursor's, which is being edited), the innermost such; "" when none does
// or the window starts with its first line.
std::string head_on_disk(const data::LinkedGraph& graph, const std::string& path, const std::string& before) {
  const std::string key = line_range(before, 0, std::min<size_t>(3, count_lines(before)));
  if (key.find_first_not_of(" \t\r\n}{;") == std::string::npos || key.size() < 12) return "";  // nothing distinctive
  const auto& g = graph.graph();
  const data::FunctionInfo* best = nullptr;
  size_t best_at = 0;
  for (uint32_t i : graph.functions_of(path)) {
    const auto& f = g.functions[i];
    const size_t p = f.text.find("\n" + key);
    if (p == std::string::npos || (best && f.text.size() >= best->text.size())) continue;
    best = &f;
    best_at = p + 1;
  }
  return best ? best->text.substr(0, best_at) : "";
}

// The first chunks, best first, that fit max_chunks and max_bytes.
std::vector<ContextChunk> within_budget(std::vector<ContextChunk> ranked, const ContextOptions& o) {
  std::vector<ContextChunk> kept;
  size_t bytes = 0;
  for (auto& c : ranked) {
    if (kept.size() == o.max_chunks) break;
    const size_t n = c.chunk.filename.size() + c.chunk.text.size();
    if (c.chunk.text.empty() || bytes + n > o.max_bytes) continue;
    bytes += n;
    kept.push_back(std::move(c));
  }
  return kept;
}

}  // namespace

std::string line_range(const std::string& text, size_t first, size_t n) {
  size_t a = 0;
  for (size_t i = 0; i < first && a != std::string::npos; ++i) {
    a = text.find('\n', a);
    if (a != std::string::npos) ++a;
  }
  if (a == std::string::npos || a >= text.size()) return "";
  size_t b = a;
  for (size_t i = 0; i < n && b < text.size(); ++i) {
    const size_t nl = text.find('\n', b);
    b = nl == std::string::npos ? text.size() : nl + 1;
  }
  return text.substr(a, b - a);
}

std::vector<ContextChunk> budget_oldest_first(std::vector<ContextChunk> ranked, const ContextOptions& o) {
  std::vector<ContextChunk> kept = within_budget(std::move(ranked), o);
  std::reverse(kept.begin(), kept.end());
  std::stable_sort(kept.begin(), kept.end(),
                   [](const ContextChunk& a, const ContextChunk& b) { return a.kind < b.kind; });
  return kept;
}

const char* chunk_kind_name(ChunkKind kind) {
  switch (kind) {
    case ChunkKind::kInclude: return "include";
    case ChunkKind::kCaller: return "caller";
    case ChunkKind::kClass: return "class";
    case ChunkKind::kTarget: return "target";
    case ChunkKind::kCallee: return "callee";
    case ChunkKind::kFile: return "file";
  }
  return "?";
}

CursorContext context_at(const data::LinkedGraph& graph, const std::string& path, const std::string& before,
                         const std::string& after, const ContextOptions& o) {
  CursorContext out;
  std::string window = before + after;
  data::CppFileParser parser;
  data::ParsedFile buffer = parser.parse(path, window);
  uint32_t cursor_line = static_cast<uint32_t>(count_lines(before) + 1);
  // The innermost definition holding the cursor's line: the one starting last.
  auto innermost = [&] {
    const auto& fns = buffer.functions();
    int at = -1;
    for (size_t i = 0; i < fns.size(); ++i)
      if (fns[i].line <= cursor_line && cursor_line <= fns[i].last_line() && (at < 0 || fns[i].line >= fns[at].line))
        at = static_cast<int>(i);
    return at;
  };
  int at = innermost();
  if (at < 0) {
    // The window may start inside a definition whose head the editor cut off (a long function: the prefix is whole
    // lines within a character budget). The workspace's copy of the file has it: the definition on disk whose text
    // holds the window's first lines gives the lines of it before them, and the two are parsed as one. Only lines
    // before the window come from disk, so nothing after the cursor (the text being written) ever does.
    if (const std::string head = head_on_disk(graph, path, before); !head.empty()) {
      window = head + window;
      buffer = parser.parse(path, window);
      cursor_line += static_cast<uint32_t>(count_lines(head));
      at = innermost();
    }
  }
  auto in_window = [&](const std::string& text) { return !text.empty() && window.find(text) != std::string::npos; };
  std::vector<ContextChunk> ranked;  // by rank, best first; the budget takes them in this order
  if (at < 0) {  // a declaration, a class body, the include block: what the headers it includes declare
    add_include_outlines(graph, buffer, path, in_window, o, ranked);
    out.chunks = budget_oldest_first(std::move(ranked), o);
    return out;
  }
  const auto& fns = buffer.functions();
  const data::FunctionInfo& here = fns[at];
  out.function = here.qualified();
  const auto& g = graph.graph();

  auto cut = [&](const std::string& text) { return with_newline(line_range(text, 0, o.max_chunk_lines)); };

  // Callees, nearest call to the cursor first (a call just typed is what the next line is likely to use).
  auto calls = graph.resolve_calls(buffer, static_cast<size_t>(at));
  std::stable_sort(calls.begin(), calls.end(), [&](const data::ResolvedCall& a, const data::ResolvedCall& b) {
    return std::abs(static_cast<long>(a.line) - static_cast<long>(cursor_line)) <
           std::abs(static_cast<long>(b.line) - static_cast<long>(cursor_line));
  });
  for (const auto& c : calls) {
    const data::FunctionInfo& f = g.functions[c.function];
    if (f.file == path && (f.qualified() == here.qualified() || in_window(f.text))) continue;
    ranked.push_back({{f.file, cut(f.text)}, ChunkKind::kCallee, f.qualified(), f.line});
  }
  // The class of a method, unless its definition is the one around the cursor (a method defined in the class body):
  // the window holds that class as the editor has it now, and the copy on disk would hold the very lines being written.
  if (!here.scope.empty())
    if (const data::ClassDef* cls = graph.find_class(here.scope);
        cls && !in_window(cls->text) &&
        !(cls->file == path && cls->line <= cursor_line && cursor_line <= cls->line + count_lines(cls->text)))
      ranked.push_back({{cls->file, cut(cls->text)}, ChunkKind::kClass, cls->qualified, cls->line});
  // Callers, from the graph's copy of this function (the file on disk): the lines around each one's first call.
  int self = -1;
  for (uint32_t i : graph.functions_of(path)) {
    const auto& f = g.functions[i];
    if (f.qualified() == here.qualified() && f.min_args == here.min_args && f.max_args == here.max_args) {
      self = static_cast<int>(i);
      break;
    }
  }
  if (self >= 0) {
    size_t callers = 0;
    for (uint32_t ci : g.callers[self]) {
      if (callers == o.max_callers) break;
      const data::FunctionInfo& f = g.functions[ci];
      if (static_cast<int>(ci) == self || (f.file == path && in_window(f.text))) continue;
      // The first line that calls it by name, and the lines around it.
      size_t pos = f.text.find(here.name + "(");
      if (pos == std::string::npos) pos = f.text.find(here.name);
      const size_t call_line =
          pos == std::string::npos ? 0 : static_cast<size_t>(std::count(f.text.begin(), f.text.begin() + pos, '\n'));
      const size_t total = count_lines(f.text) + 1;
      size_t first = 0;
      if (total > o.max_chunk_lines)
        first = std::min(call_line > o.max_chunk_lines / 2 ? call_line - o.max_chunk_lines / 2 : 0,
                         total - o.max_chunk_lines);
      ranked.push_back({{f.file, with_newline(line_range(f.text, first, o.max_chunk_lines))},
                        ChunkKind::kCaller,
                        f.qualified(),
                        f.line + static_cast<uint32_t>(first)});
      ++callers;
    }
  }
  // Included headers of the workspace: their first lines after the license.
  add_include_outlines(graph, buffer, path, in_window, o, ranked);

  out.chunks = budget_oldest_first(std::move(ranked), o);
  return out;
}

std::vector<ContextChunk> file_context(const data::LinkedGraph& graph, const std::string& path, const std::string& text,
                                       const ContextOptions& o) {
  data::CppFileParser parser;
  const data::ParsedFile buffer = parser.parse(path, text);
  const auto& g = graph.graph();
  // The file itself, its first 4 x max_chunk_lines lines: what the question is about gets the most room.
  std::string head = with_newline(line_range(text, 0, 4 * o.max_chunk_lines));
  if (head.size() > o.max_bytes / 2) head = head.substr(0, head.rfind('\n', o.max_bytes / 2) + 1);  // whole lines
  std::vector<ContextChunk> ranked = {{{path, head}, ChunkKind::kFile, path, 1}};
  auto in_file = [&](const std::string& t) { return !t.empty() && text.find(t) != std::string::npos; };
  // The definitions its functions call elsewhere, each once, in the order of the file's calls.
  std::vector<uint32_t> seen;
  for (size_t fn = 0; fn < buffer.functions().size(); ++fn)
    for (const auto& call : graph.resolve_calls(buffer, fn)) {
      const data::FunctionInfo& f = g.functions[call.function];
      if (f.file == path || std::find(seen.begin(), seen.end(), call.function) != seen.end() || in_file(f.text))
        continue;
      seen.push_back(call.function);
      ranked.push_back({{f.file, with_newline(line_range(f.text, 0, o.max_chunk_lines))},
                        ChunkKind::kCallee,
                        f.qualified(),
                        f.line});
    }
  add_include_outlines(graph, buffer, path, in_file, o, ranked);
  return within_budget(std::move(ranked), o);
}

std::vector<text::InfillChunk> merge_chunks(const std::vector<text::InfillChunk>& client,
                                            const std::vector<ContextChunk>& ours, size_t* duplicates,
                                            std::vector<bool>* ours_kept) {
  std::vector<text::InfillChunk> out;
  if (ours_kept) ours_kept->assign(ours.size(), false);
  size_t dup = 0;
  for (const auto& c : client) {
    if (std::any_of(out.begin(), out.end(),
                    [&](const text::InfillChunk& k) { return k.filename == c.filename && k.text == c.text; })) {
      ++dup;
      continue;
    }
    out.push_back(c);
  }
  const size_t from_client = out.size();
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto& c = ours[i];
    if (std::any_of(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(from_client),
                    [&](const text::InfillChunk& k) { return k.text.find(c.chunk.text) != std::string::npos; })) {
      ++dup;
      continue;
    }
    out.push_back(c.chunk);
    if (ours_kept) (*ours_kept)[i] = true;
  }
  if (duplicates) *duplicates = dup;
  return out;
}

}  // namespace slm::workspace
