#include "slm/eval/context_adherence.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "slm/data/callgraph.h"
#include "slm/data/hashing.h"
#include "slm/eval/stop.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/process.h"

namespace slm::eval {

namespace {

namespace fs = std::filesystem;

bool is_ident_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

const std::set<std::string>& keywords() {
  // clang-format off
  static const std::set<std::string> k = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
      "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
      "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
      "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "final", "float",
      "for", "friend", "goto", "if", "import", "inline", "int", "long", "module", "mutable", "namespace", "new",
      "noexcept", "not", "not_eq", "nullptr", "operator", "or", "or_eq", "override", "private", "protected",
      "public", "register", "reinterpret_cast", "requires", "return", "short", "signed", "sizeof", "static",
      "static_assert", "static_cast", "struct", "switch", "template", "this", "thread_local", "throw", "true", "try",
      "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t",
      "while", "xor", "xor_eq"};
  // clang-format on
  return k;
}

// Keywords after which an identifier is an expression, not a declared name (`return x;`, `new T(...)`).
bool is_statement_keyword(const std::string& w) {
  static const std::set<std::string> s = {
      "return", "throw",   "else",   "case", "goto", "new", "delete",   "co_return", "co_yield",  "co_await",
      "sizeof", "alignof", "typeid", "not",  "and",  "or",  "operator", "using",     "namespace", "do"};
  return s.count(w) > 0;
}

struct Token {
  bool ident = false;
  std::string text;  // identifiers and punctuation ("->", "::", "&&", ">>" as one token); literals are "0"
};

// The tokens of C++ text, enough to tell identifiers, calls and declarations apart.
std::vector<Token> lex(const std::string& t) {
  std::vector<Token> out;
  constexpr size_t npos = std::string::npos;
  bool line_start = true;
  for (size_t i = 0; i < t.size();) {
    const char c = t[i];
    if (c == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i;
      continue;
    }
    if (line_start && c == '#') {  // a preprocessor line, with its continuations
      size_t e = i;
      while ((e = t.find('\n', e)) != npos && e > 0 && t[e - 1] == '\\') ++e;
      i = e == npos ? t.size() : e;
      continue;
    }
    line_start = false;
    if (c == '/' && i + 1 < t.size() && t[i + 1] == '/') {
      const size_t e = t.find('\n', i);
      i = e == npos ? t.size() : e;
    } else if (c == '/' && i + 1 < t.size() && t[i + 1] == '*') {
      const size_t e = t.find("*/", i + 2);
      i = e == npos ? t.size() : e + 2;
    } else if (c == 'R' && i + 1 < t.size() && t[i + 1] == '"' && (i == 0 || !is_ident_char(t[i - 1]))) {
      const size_t paren = t.find('(', i + 2);
      const size_t e = paren == npos ? npos : t.find(")" + t.substr(i + 2, paren - i - 2) + "\"", paren);
      i = e == npos ? t.size() : e + (paren - i - 2) + 2;
      out.push_back({false, "0"});
    } else if (c == '"' || c == '\'') {
      for (++i; i < t.size() && t[i] != c && t[i] != '\n'; ++i)
        if (t[i] == '\\') ++i;
      ++i;
      out.push_back({false, "0"});
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '.' && i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1])))) {
      while (i < t.size() && (is_ident_char(t[i]) || t[i] == '.' || t[i] == '\'')) ++i;
      out.push_back({false, "0"});
    } else if (is_ident_start(c)) {
      size_t e = i;
      while (e < t.size() && is_ident_char(t[e])) ++e;
      out.push_back({true, t.substr(i, e - i)});
      i = e;
    } else {
      std::string p(1, c);
      for (const char* two : {"->", "::", "&&", ">>"})
        if (t.compare(i, 2, two) == 0) p = two;
      out.push_back({false, p});
      i += p.size();
    }
  }
  return out;
}

std::set<std::string> identifier_set(const std::string& text) {
  std::set<std::string> s;
  for (const auto& tok : lex(text))
    if (tok.ident) s.insert(tok.text);
  return s;
}

std::string include_lines(const std::string& text) {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t p = line.find_first_not_of(" \t");
    if (p != std::string::npos && line.compare(p, 8, "#include") == 0) out += line.substr(p) + "\n";
  }
  return out;
}

std::string piece(const data::FunctionInfo& f) {
  return "// " + f.file + ":" + std::to_string(f.line) + "\n" + f.text + "\n\n";
}

}  // namespace

std::vector<std::string> cpp_identifiers(const std::string& text) {
  std::vector<std::string> out;
  for (auto& tok : lex(text))
    if (tok.ident) out.push_back(std::move(tok.text));
  return out;
}

AdherenceScore score_adherence(const std::string& completion, const std::vector<std::string>& callees,
                               const std::function<bool(const std::string&)>& known) {
  const auto toks = lex(completion);
  const std::set<std::string> wanted(callees.begin(), callees.end());
  std::set<std::string> used, declared;
  AdherenceScore s;
  for (size_t i = 0; i < toks.size(); ++i) {
    if (!toks[i].ident || keywords().count(toks[i].text)) continue;
    const std::string& w = toks[i].text;
    const std::string next = i + 1 < toks.size() ? toks[i + 1].text : "";
    if (wanted.count(w)) {
      if (next == "(") s.calls_callee = true;
      if (next == "<") {  // a template argument list, then the call
        int depth = 0;
        for (size_t j = i + 1; j < toks.size(); ++j) {
          const std::string& p = toks[j].text;
          if (p == "<") ++depth;
          if (p == ">") --depth;
          if (p == ">>") depth -= 2;
          if (p == ";" || p == "{" || depth < 0) break;
          if (depth == 0) {
            if (j + 1 < toks.size() && toks[j + 1].text == "(") s.calls_callee = true;
            break;
          }
        }
      }
    }
    const Token* prev = i > 0 ? &toks[i - 1] : nullptr;
    const bool type_like = prev && (prev->ident ? !is_statement_keyword(prev->text)
                                                : (prev->text == ">" || prev->text == ">>" || prev->text == "*" ||
                                                   prev->text == "&" || prev->text == "&&"));
    static const std::set<std::string> after_declared = {"=", ";", "(", "{", ",", "[", ":", ")"};
    if (type_like && after_declared.count(next))
      declared.insert(w);
    else
      used.insert(w);
  }
  for (const auto& w : used)
    if (!declared.count(w)) {
      s.identifiers.push_back(w);
      if (!known(w)) s.unknown.push_back(w);
    }
  return s;
}

std::vector<ContextCase> make_context_cases(const std::string& root_dir, const ContextCaseOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(root_dir, ec)) throw Error("context adherence: " + root_dir + " is not a directory");
  data::CallGraphOptions go;
  go.src_dir = root_dir;
  const auto g = data::build_call_graph(go);
  std::map<std::string, std::string> include_block;  // file -> its #include lines
  std::map<std::string, std::vector<ContextCase>> by_file;
  for (uint32_t t = 0; t < g.functions.size(); ++t) {
    const auto& f = g.functions[t];
    const auto split = split_body(f.text, options.cut);
    if (!split) continue;
    std::vector<uint32_t> callees;
    for (uint32_t c : g.callees[t])
      if (c != t) callees.push_back(c);
    if (callees.empty()) continue;
    if (!include_block.count(f.file)) include_block[f.file] = include_lines(read_file(root_dir + "/" + f.file));
    ContextCase cc;
    const std::string& includes = include_block[f.file];
    const std::string head = "// " + f.file + ":" + std::to_string(f.line) + "\n" + f.text.substr(0, split->head_end);
    const size_t fixed = (includes.empty() ? 0 : includes.size() + 1) + head.size();
    if (fixed >= options.max_prompt_bytes) continue;
    const size_t budget = options.max_prompt_bytes - fixed;
    std::string context;
    std::set<std::string> names;
    for (uint32_t c : callees)
      if (context.size() + piece(g.functions[c]).size() <= budget) {
        context += piece(g.functions[c]);
        names.insert(g.functions[c].name);
      }
    if (names.empty()) continue;
    for (uint32_t c : g.callers[t])
      if (c != t && context.size() + piece(g.functions[c]).size() <= budget) {
        context += piece(g.functions[c]);
        ++cc.callers;
      }
    cc.file = f.file;
    cc.callees.assign(names.begin(), names.end());
    cc.body = split->body;
    cc.problem.name = f.file + ":" + std::to_string(f.line) + ":" + f.qualified();
    cc.problem.prompt = (includes.empty() ? "" : includes + "\n") + context + head;
    cc.problem.stop_tokens = {split->stop};
    cc.problem.tests = f.text.substr(split->close_line);
    by_file[f.file].push_back(std::move(cc));
  }
  std::vector<ContextCase> cases;
  for (auto& [file, list] : by_file) {
    if (list.size() > options.cut.max_per_file) {  // spread over the file by a hash of the names, as compile-pass
      std::stable_sort(list.begin(), list.end(), [](const ContextCase& a, const ContextCase& b) {
        return data::hash64(a.problem.name) < data::hash64(b.problem.name);
      });
      list.resize(options.cut.max_per_file);
    }
    for (auto& c : list) cases.push_back(std::move(c));
  }
  if (options.max_cases > 0 && cases.size() > options.max_cases) {
    std::stable_sort(cases.begin(), cases.end(), [](const ContextCase& a, const ContextCase& b) {
      return data::hash64(a.problem.name) < data::hash64(b.problem.name);
    });
    cases.resize(options.max_cases);
    std::stable_sort(cases.begin(), cases.end(),
                     [](const ContextCase& a, const ContextCase& b) { return a.problem.name < b.problem.name; });
  }
  return cases;
}

KnownIdentifiers::KnownIdentifiers(std::string compiler, std::string standard, std::vector<std::string> include_dirs)
    : compiler_(std::move(compiler)), standard_(std::move(standard)), include_dirs_(std::move(include_dirs)) {}

std::set<std::string> KnownIdentifiers::preprocess(const std::string& lines, const std::string& dir) {
  char tmpl[] = "/tmp/slm-context-XXXXXX";
  if (!::mkdtemp(tmpl)) throw Error("context adherence: cannot create a temporary directory in /tmp");
  const std::string tmp = tmpl, src = tmp + "/includes.cpp";
  write_file_atomic(src, lines);
  // -dD keeps the macro definitions (assert, EXIT_SUCCESS) that preprocessing would otherwise expand away.
  std::vector<std::string> argv = {compiler_, "-E", "-P", "-dD", "-w", "-std=" + standard_, "-x", "c++"};
  if (!dir.empty()) argv.insert(argv.end(), {"-iquote", dir});
  for (const auto& d : include_dirs_) argv.push_back("-I" + d);
  argv.push_back(src);
  ProcessOptions po;
  po.timeout_s = 60;
  po.max_output = 64 << 20;
  const auto r = run_process(argv, po);
  remove_tree(tmp);
  if (!r.ok() || r.output_truncated) return {};
  return identifier_set(r.out);
}

const std::set<std::string>& KnownIdentifiers::standard_library() {
  std::lock_guard lock(mu_);
  if (!have_std_) {
    std_ = preprocess("#include <bits/stdc++.h>\n", "");
    if (std_.empty())  // not libstdc++: the standard headers one at a time, keeping those that exist
      for (const char* h :
           {"algorithm",   "array",   "atomic",     "bitset",      "cassert",       "cctype",        "chrono",
            "cmath",       "cstdint", "cstdio",     "cstdlib",     "cstring",       "deque",         "exception",
            "filesystem",  "fstream", "functional", "iomanip",     "iostream",      "iterator",      "limits",
            "list",        "map",     "memory",     "mutex",       "numeric",       "optional",      "queue",
            "random",      "regex",   "set",        "sstream",     "stack",         "stdexcept",     "string",
            "string_view", "thread",  "tuple",      "type_traits", "unordered_map", "unordered_set", "utility",
            "variant",     "vector"})
        for (auto& w : preprocess(std::string("#include <") + h + ">\n", "")) std_.insert(w);
    have_std_ = true;
  }
  return std_;
}

std::set<std::string> KnownIdentifiers::of_file(const std::string& text, const std::string& dir) {
  std::set<std::string> out = identifier_set(text);
  const std::string lines = include_lines(text);
  if (lines.empty()) return out;
  auto cached = [&](const std::string& key, const std::string& what) {
    {
      std::lock_guard lock(mu_);
      if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    }
    auto ids = preprocess(what, dir);
    std::lock_guard lock(mu_);
    return cache_[key] = std::move(ids);
  };
  // All the lines at once; when one of them fails (a header of another package), each line on its own.
  auto all = cached(dir + "\n" + lines, lines);
  if (all.empty()) {
    std::istringstream in(lines);
    for (std::string line; std::getline(in, line);)
      for (auto& w : cached(dir + "\n" + line, line + "\n")) all.insert(w);
  }
  out.insert(all.begin(), all.end());
  return out;
}

nlohmann::json ContextReport::json() const {
  return {{"cases", cases},
          {"completions", completions},
          {"adherence", adherence()},
          {"adhering", adhering},
          {"hallucination_rate", hallucination_rate()},
          {"identifiers", identifiers},
          {"unknown_identifiers", unknown},
          {"completions_with_unknown", with_unknown},
          {"specialists", specialists}};
}

ContextReport run_context_adherence(const std::vector<ContextCase>& cases, CompletionSource& source, int n,
                                    KnownIdentifiers& known, const std::string& root, const std::string& results_path,
                                    const std::function<void(size_t, size_t)>& progress) {
  ContextReport r;
  r.cases = cases.size();
  const auto& std_ids = known.standard_library();
  std::ofstream results;
  if (!results_path.empty()) {
    results.open(results_path);
    if (!results) throw Error(results_path + ": cannot write");
  }
  std::vector<Problem> problems;
  for (const auto& c : cases) problems.push_back(c.problem);
  std::map<std::string, std::set<std::string>> file_ids;  // the target's file (its body removed) and its includes
  size_t done = 0;
  source.complete(problems, n, [&](size_t i, std::vector<Completion> completions) {
    const auto& c = cases[i];
    if (!file_ids.count(c.file)) {
      std::string text = read_file(root + "/" + c.file);
      if (const size_t at = text.find(c.body); at != std::string::npos) text.erase(at, c.body.size());
      file_ids[c.file] = known.of_file(text, (fs::path(root) / c.file).parent_path().string());
    }
    const auto prompt_ids = identifier_set(c.problem.prompt);
    const auto& fids = file_ids[c.file];
    auto is_known = [&](const std::string& w) { return prompt_ids.count(w) || fids.count(w) || std_ids.count(w); };
    for (const auto& raw : completions) {
      const std::string completion = truncate_at_stop(raw.text, c.problem.stop_tokens);
      const auto s = score_adherence(completion, c.callees, is_known);
      ++r.completions;
      r.adhering += s.calls_callee;
      r.identifiers += s.identifiers.size();
      r.unknown += s.unknown.size();
      r.with_unknown += !s.unknown.empty();
      if (!raw.specialist.empty()) ++r.specialists[raw.specialist];
      if (results.is_open()) {
        nlohmann::json line = {{"task_id", c.problem.name},      {"callees", c.callees},
                               {"calls_callee", s.calls_callee}, {"identifiers", s.identifiers.size()},
                               {"unknown", s.unknown},           {"completion", completion}};
        if (!raw.specialist.empty()) line["specialist"] = raw.specialist;
        results << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      }
    }
    if (progress) progress(++done, cases.size());
    return true;
  });
  return r;
}

}  // namespace slm::eval
