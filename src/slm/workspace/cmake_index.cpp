#include "slm/workspace/cmake_index.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

namespace slm::workspace {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

uint32_t count_lines(const std::string& s, size_t from, size_t to) {
  return static_cast<uint32_t>(
      std::count(s.begin() + static_cast<std::ptrdiff_t>(from), s.begin() + static_cast<std::ptrdiff_t>(to), '\n'));
}

// The whole lines holding bytes [begin, end) of text.
std::string whole_lines(const std::string& text, size_t begin, size_t end) {
  const size_t nl = begin == 0 ? std::string::npos : text.rfind('\n', begin - 1);
  const size_t a = nl == std::string::npos ? 0 : nl + 1;
  size_t b = end == 0 ? 0 : text.find('\n', end - 1);
  b = b == std::string::npos ? text.size() : b + 1;
  std::string out = text.substr(a, b - a);
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

// CMake's lexer, enough for its commands: a cursor over the text that counts lines.
class Lexer {
 public:
  explicit Lexer(const std::string& t) : t_(t) {}

  std::vector<CMakeCommand> commands() {
    std::vector<CMakeCommand> out;
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == '#') {
        comment();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t begin = i_;
        const uint32_t line = line_;
        while (i_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[i_])) || t_[i_] == '_')) ++i_;
        std::string name = lower(t_.substr(begin, i_ - begin));
        size_t j = i_;
        while (j < t_.size() && (t_[j] == ' ' || t_[j] == '\t')) ++j;
        if (j < t_.size() && t_[j] == '(') {
          i_ = j + 1;
          CMakeCommand cmd{std::move(name), arguments(), line, begin, i_};
          out.push_back(std::move(cmd));
        }
      } else {
        step();
      }
    }
    return out;
  }

 private:
  void step() {
    if (t_[i_] == '\n') ++line_;
    ++i_;
  }
  // At '[': the number of '=' of a bracket opening "[=*[", or -1.
  int bracket_at(size_t p) const {
    if (p >= t_.size() || t_[p] != '[') return -1;
    size_t q = p + 1;
    while (q < t_.size() && t_[q] == '=') ++q;
    return q < t_.size() && t_[q] == '[' ? static_cast<int>(q - p - 1) : -1;
  }
  // At a bracket opening with eq '='s: its content (a newline right after the opening is not part of it).
  std::string bracket(int eq) {
    const size_t start = i_ + static_cast<size_t>(eq) + 2;
    const std::string close = "]" + std::string(static_cast<size_t>(eq), '=') + "]";
    const size_t e = t_.find(close, start);
    const size_t stop = e == std::string::npos ? t_.size() : e;
    size_t from = start;
    if (from < stop && t_[from] == '\n') ++from;
    std::string content = t_.substr(from, stop - from);
    line_ += count_lines(t_, i_, stop);
    i_ = e == std::string::npos ? t_.size() : e + close.size();
    return content;
  }
  void comment() {  // at '#': a bracket comment or to the end of the line
    if (const int eq = bracket_at(i_ + 1); eq >= 0) {
      ++i_;
      bracket(eq);
      return;
    }
    const size_t nl = t_.find('\n', i_);
    i_ = nl == std::string::npos ? t_.size() : nl;
  }
  // After the '(' of an invocation: the arguments up to the matching ')' (nested parentheses separate arguments).
  std::vector<std::string> arguments() {
    std::vector<std::string> args;
    std::string cur;
    bool have = false;
    auto flush = [&] {
      if (have) args.push_back(std::move(cur));
      cur.clear();
      have = false;
    };
    int depth = 1;
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == ')') {
        flush();
        ++i_;
        if (--depth == 0) return args;
      } else if (c == '(') {
        flush();
        ++depth;
        ++i_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        flush();
        step();
      } else if (c == '#') {  // no unquoted argument holds a '#': a comment starts
        flush();
        comment();
      } else if (c == '"') {
        flush();
        ++i_;
        while (i_ < t_.size() && t_[i_] != '"') {
          if (t_[i_] == '\\' && i_ + 1 < t_.size()) ++i_;
          if (t_[i_] == '\n') ++line_;
          cur += t_[i_++];
        }
        ++i_;
        have = true;
        flush();
      } else if (const int eq = c == '[' && !have ? bracket_at(i_) : -1; eq >= 0) {
        cur = bracket(eq);
        have = true;
        flush();
      } else {
        if (c == '\\' && i_ + 1 < t_.size()) cur += t_[i_++];
        cur += t_[i_++];
        have = true;
      }
    }
    flush();
    return args;  // cut off (a cursor inside the invocation)
  }

  const std::string& t_;
  size_t i_ = 0;
  uint32_t line_ = 1;
};

bool defines_target(const std::string& command) {
  return command == "add_library" || command == "add_executable" || command == "add_custom_target";
}

// What an includer sees first of a module: its first lines after the leading comments and blank lines.
std::string cmake_head(const std::string& text) {
  size_t p = 0;
  while (p < text.size()) {
    const size_t nl = text.find('\n', p);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    const size_t first = text.find_first_not_of(" \t\r", p);
    if (first < end - (nl == std::string::npos ? 0 : 1) && text[first] != '#') break;
    p = end;
  }
  static constexpr size_t kLines = 64, kBytes = 8192;
  size_t end = p;
  for (size_t lines = 0; end < text.size() && lines < kLines; ++lines) {
    const size_t nl = text.find('\n', end);
    const size_t next = nl == std::string::npos ? text.size() : nl + 1;
    if (next - p > kBytes) break;
    end = next;
  }
  return text.substr(p, end - p);
}

}  // namespace

bool is_cmake_name(const std::string& path) {
  return base_name(path) == "CMakeLists.txt" || ends_with(path, ".cmake");
}

std::vector<CMakeCommand> parse_cmake_commands(const std::string& text) {
  return Lexer(text).commands();
}

CMakeFile parse_cmake_file(const std::string& path, const std::string& text) {
  CMakeFile f;
  f.path = path;
  f.text = text;
  f.commands = parse_cmake_commands(text);
  f.head = cmake_head(text);
  const auto& cmds = f.commands;
  for (size_t i = 0; i < cmds.size(); ++i) {
    const CMakeCommand& c = cmds[i];
    if (c.args.empty()) continue;
    if (c.name == "function" || c.name == "macro") {
      // To the matching end command (definitions of the same kind may nest); the rest of the text when it is missing.
      const std::string end_name = "end" + c.name;
      size_t end = text.size(), depth = 1;
      for (size_t j = i + 1; j < cmds.size(); ++j) {
        if (cmds[j].name == c.name) ++depth;
        if (cmds[j].name == end_name && --depth == 0) {
          end = cmds[j].end;
          break;
        }
      }
      f.definitions.push_back(
          {CMakeDefinition::Kind::kFunction, lower(c.args[0]), path, c.line, whole_lines(text, c.begin, end)});
    } else if (defines_target(c.name)) {
      std::string body = whole_lines(text, c.begin, c.end);
      size_t last = c.end;
      for (size_t j = i + 1; j < cmds.size(); ++j)
        if ((cmds[j].name.rfind("target_", 0) == 0 || cmds[j].name == "set_target_properties") &&
            !cmds[j].args.empty() && cmds[j].args[0] == c.args[0] && cmds[j].begin >= last) {
          body += whole_lines(text, cmds[j].begin, cmds[j].end);
          last = cmds[j].end;
        }
      f.definitions.push_back({CMakeDefinition::Kind::kTarget, c.args[0], path, c.line, std::move(body)});
    }
  }
  return f;
}

CMakeIndex::CMakeIndex(std::vector<std::shared_ptr<const CMakeFile>> files) : files_(std::move(files)) {
  for (const auto& f : files_) {
    paths_.insert(f->path);
    for (const auto& d : f->definitions)
      (d.kind == CMakeDefinition::Kind::kFunction ? functions_ : targets_).emplace(d.name, &d);
    for (const auto& c : f->commands) calls_.emplace(c.name, std::pair{f.get(), &c});
    if (ends_with(f->path, ".cmake")) modules_.emplace(lower(base_name(f->path)), f.get());
  }
}

size_t CMakeIndex::definitions() const {
  return functions_.size() + targets_.size();
}

CursorContext CMakeIndex::context_at(const std::string& path, const std::string& before, const std::string& after,
                                     const ContextOptions& o) const {
  CursorContext out;
  const std::string window = before + after;
  const CMakeFile buffer = parse_cmake_file(path, window);
  const uint32_t cursor_line = static_cast<uint32_t>(std::count(before.begin(), before.end(), '\n') + 1);
  std::set<std::string> own_functions, own_targets;  // what the window defines itself (as the editor has it now)
  for (const auto& d : buffer.definitions) {
    (d.kind == CMakeDefinition::Kind::kFunction ? own_functions : own_targets).insert(d.name);
    if (d.kind == CMakeDefinition::Kind::kFunction && d.line <= cursor_line &&
        cursor_line < d.line + static_cast<uint32_t>(std::count(d.text.begin(), d.text.end(), '\n')))
      out.function = d.name;  // the innermost: definitions come in order of their start
  }
  // The window's invocations, nearest to the cursor first.
  std::vector<const CMakeCommand*> near;
  for (const auto& c : buffer.commands) near.push_back(&c);
  std::stable_sort(near.begin(), near.end(), [&](const CMakeCommand* a, const CMakeCommand* b) {
    return std::abs(static_cast<long>(a->line) - static_cast<long>(cursor_line)) <
           std::abs(static_cast<long>(b->line) - static_cast<long>(cursor_line));
  });
  auto cut = [&](const std::string& text) { return line_range(text, 0, o.max_chunk_lines); };
  // One definition of a name: the first of another file, else the first (in file order).
  auto pick = [&](const std::multimap<std::string, const CMakeDefinition*>& by, const std::string& name) {
    const CMakeDefinition* best = nullptr;
    for (auto [it, e] = by.equal_range(name); it != e; ++it)
      if (!best || (best->file == path && it->second->file != path)) best = it->second;
    return best;
  };
  std::vector<ContextChunk> ranked;
  std::set<const CMakeDefinition*> taken;
  for (const CMakeCommand* c : near)  // the functions and macros it invokes
    if (!own_functions.count(c->name))
      if (const CMakeDefinition* d = pick(functions_, c->name); d && taken.insert(d).second)
        ranked.push_back({{d->file, cut(d->text)}, ChunkKind::kCallee, d->name, d->line});
  for (const CMakeCommand* c : near)  // the targets it names
    for (const auto& a : c->args)
      if (!own_targets.count(a))
        if (const CMakeDefinition* d = pick(targets_, a); d && taken.insert(d).second)
          ranked.push_back({{d->file, cut(d->text)}, ChunkKind::kTarget, d->name, d->line});
  if (!out.function.empty()) {  // the invocations of the function being written
    size_t callers = 0;
    for (auto [it, e] = calls_.equal_range(out.function); it != e && callers < o.max_callers; ++it) {
      const auto& [file, cmd] = it->second;
      if (file->path == path) continue;  // the file's own calls: the window holds the newest text of them
      ranked.push_back({{file->path, cut(whole_lines(file->text, cmd->begin, cmd->end))},
                        ChunkKind::kCaller,
                        file->path,
                        cmd->line});
      ++callers;
    }
  }
  size_t includes = 0;  // the modules it includes
  for (const auto& c : buffer.commands) {
    if (c.name != "include" || c.args.empty() || includes == o.max_includes) continue;
    std::string key = lower(base_name(c.args[0]));
    if (!ends_with(key, ".cmake")) key += ".cmake";
    const CMakeFile* best = nullptr;
    for (auto [it, e] = modules_.equal_range(key); it != e; ++it)
      if (it->second->path != path && (!best || it->second->path.size() < best->path.size())) best = it->second;
    if (!best || best->head.empty()) continue;
    ranked.push_back({{best->path, cut(best->head)}, ChunkKind::kInclude, best->path, 0});
    ++includes;
  }
  out.chunks = budget_oldest_first(std::move(ranked), o);
  return out;
}

}  // namespace slm::workspace
