#include "slm/data/callgraph.h"

#include <tree_sitter/api.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "slm/data/text.h"
#include "slm/util/error.h"

extern "C" const TSLanguage* tree_sitter_cpp(void);

namespace slm::data {

namespace fs = std::filesystem;

std::string FunctionInfo::signature() const {
  std::string out = qualified();
  out += '(';
  out += std::to_string(min_args);
  if (max_args >= kVariadic) {
    out += '+';
  } else if (max_args != min_args) {
    out += '-';
    out += std::to_string(max_args);
  }
  out += ')';
  return out;
}

uint64_t CallGraph::edge_count() const {
  uint64_t n = 0;
  for (const auto& c : callees) n += c.size();
  return n;
}

bool is_cpp_source_name(const std::string& path) {
  static const std::unordered_set<std::string> kExt = {".cc",  ".cpp", ".cxx", ".c++", ".C",   ".h",  ".hh",
                                                       ".hpp", ".hxx", ".h++", ".ipp", ".inl", ".tcc"};
  const auto dot = path.rfind('.');
  const auto slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return false;
  return kExt.count(path.substr(dot)) > 0;
}

namespace {

std::vector<std::string> split_scope(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t e = s.find("::", p);
    if (e == std::string::npos) e = s.size();
    if (e > p) out.push_back(s.substr(p, e - p));
    p = e + 2;
  }
  return out;
}

std::string join_scope(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (!out.empty()) out += "::";
    out += parts[i];
  }
  return out;
}

std::string qualify(const std::string& scope, const std::string& name) {
  if (scope.empty()) return name;
  return name.empty() ? scope : scope + "::" + name;
}

std::string last_part(const std::string& q) {
  const auto p = q.rfind("::");
  return p == std::string::npos ? q : q.substr(p + 2);
}

// A type as the resolver sees it: a (possibly qualified) class name without template arguments. A guess comes
// from `auto x = F(...)`, where F may be a class (a constructor call) or a function.
struct TypeRef {
  std::string name;
  bool guess = false;
};

struct ClassInfo {
  std::string decl_scope;                           // where it was declared, to resolve base names
  std::vector<std::string> bases;                   // as written, template arguments dropped
  std::unordered_map<std::string, TypeRef> fields;  // data member -> its class type
};

enum class CallKind : uint8_t { kName, kQualified, kMember, kConstruct };
enum class Receiver : uint8_t { kNone, kThis, kType, kField, kUnknown };

struct FileUsing;

struct CallSite {
  uint32_t caller = 0;  // index of the calling function in its file's functions (in the linked graph's, once linked)
  // The calling function and its file's usings, as the resolver reads them (set when a graph is linked, or for a
  // buffer's calls resolved against a graph it is not part of).
  const FunctionInfo* from = nullptr;
  const FileUsing* from_using = nullptr;
  uint32_t line = 0;  // 1-based line of the call in its file
  CallKind kind = CallKind::kName;
  Receiver receiver = Receiver::kNone;
  bool global = false;    // "::f" / "::ns::f"
  bool guess = false;     // receiver type is a guess
  std::string name;       // the called name (last component), or the constructed type for kConstruct
  std::string qualifier;  // kQualified: "ns::A"; kMember: receiver type (kType) or field name (kField)
  int args = 0;
};

// Per file: using-directives (`using namespace X;`, with the scope they appear in) and using-declarations
// (`using X::f;`), both applied to the whole file (block scope is not tracked), and the #include paths.
struct FileUsing {
  std::vector<std::pair<std::string, std::string>> directives;  // (scope, namespace as written)
  std::unordered_map<std::string, std::string> aliases;         // f -> X::f
  std::vector<std::string> includes;                            // "a/b.h" of #include "a/b.h" or <a/b.h>
};

// Member functions of the standard containers, strings, streams and smart pointers.
const std::unordered_set<std::string>& std_member_names() {
  static const std::unordered_set<std::string> k = {
      "size",        "empty",   "data",        "c_str",     "begin",     "end",          "cbegin",      "cend",
      "rbegin",      "rend",    "front",       "back",      "push_back", "emplace_back", "pop_back",    "push_front",
      "pop_front",   "insert",  "emplace",     "erase",     "clear",     "find",         "count",       "contains",
      "at",          "reserve", "resize",      "capacity",  "swap",      "substr",       "append",      "compare",
      "length",      "str",     "get",         "reset",     "release",   "lock",         "unlock",      "load",
      "store",       "value",   "has_value",   "first",     "second",    "write",        "read",        "flush",
      "close",       "open",    "good",        "fail",      "eof",       "what",         "lower_bound", "upper_bound",
      "equal_range", "assign",  "starts_with", "ends_with", "rfind",     "top",          "push",        "pop"};
  return k;
}

const std::unordered_set<std::string>& cast_names() {
  static const std::unordered_set<std::string> k = {"static_cast", "dynamic_cast", "const_cast", "reinterpret_cast",
                                                    "bit_cast"};
  return k;
}

bool is(TSNode n, const char* type) {
  return !ts_node_is_null(n) && std::strcmp(ts_node_type(n), type) == 0;
}

TSNode field(TSNode n, const char* name) {
  return ts_node_child_by_field_name(n, name, static_cast<uint32_t>(std::strlen(name)));
}

// Children through a cursor (ts_node_child(i) is linear in i, so indexing a long list would be quadratic). fn
// takes (TSNode) or (TSNode, field name). Only the second asks for field names: the cursor finds one by walking its
// stack of hidden ancestors, which in error recovery's long flat runs is as deep as the run, so asking for every child
// was quadratic (minutes on one file of a package, aws-crt-python).
template <typename Fn>
void for_each_child(TSNode n, Fn&& fn) {
  TSTreeCursor c = ts_tree_cursor_new(n);
  if (ts_tree_cursor_goto_first_child(&c)) {
    do {
      TSNode ch = ts_tree_cursor_current_node(&c);
      if constexpr (std::is_invocable_v<Fn, TSNode>) {
        fn(ch);
      } else {
        const char* f = ts_tree_cursor_current_field_name(&c);
        fn(ch, f ? f : "");
      }
    } while (ts_tree_cursor_goto_next_sibling(&c));
  }
  ts_tree_cursor_delete(&c);
}

int count_arguments(TSNode args) {
  if (ts_node_is_null(args)) return 0;
  int n = 0;
  for_each_child(args, [&](TSNode ch) {
    if (ts_node_is_named(ch) && !is(ch, "comment")) ++n;
  });
  return n;
}

class FileParser {
 public:
  // Appends the file's functions and call sites; its classes go to `classes` (merged by the caller once the
  // file is accepted).
  FileParser(const std::string& path, const std::string& src, std::vector<FunctionInfo>& functions,
             std::unordered_map<std::string, ClassInfo>& classes, std::vector<ClassDef>& class_defs,
             std::vector<CallSite>& calls, FileUsing& using_)
      : path_(path),
        src_(src),
        functions_(functions),
        classes_(classes),
        class_defs_(class_defs),
        calls_(calls),
        using_(using_) {}

  void run(TSNode root) { visit(root, 0); }
  // Bytes of tokens the parser could not place, and of all tokens (comments and strings aside).
  uint64_t error_bytes() const { return error_bytes_; }
  uint64_t token_bytes() const { return token_bytes_; }

 private:
  std::string text(TSNode n) const {
    const uint32_t a = ts_node_start_byte(n), b = ts_node_end_byte(n);
    return b > a && b <= src_.size() ? src_.substr(a, b - a) : std::string();
  }

  std::string scope_string() const {
    std::string out;
    for (const auto& s : scope_)
      if (!s.name.empty()) out = qualify(out, s.name);
    return out;
  }

  // "operator +" and "operator +=" as one token each, so declarations and calls spell them alike.
  std::string name_text(TSNode n) const {
    if (is(n, "template_function") || is(n, "template_method")) return name_text(field(n, "name"));
    std::string t = text(n);
    if (is(n, "operator_name") || is(n, "destructor_name")) t.erase(std::remove(t.begin(), t.end(), ' '), t.end());
    return t;
  }

  // Splits a possibly qualified name into its scope parts and final name node; false for scopes we cannot name
  // (decltype, dependent types).
  bool split_qualified(TSNode n, std::vector<std::string>& parts, bool& global, TSNode& last) const {
    global = false;
    bool first = true;
    while (is(n, "qualified_identifier")) {
      TSNode s = field(n, "scope");
      if (ts_node_is_null(s)) {
        if (first) global = true;
      } else if (is(s, "namespace_identifier") || is(s, "type_identifier")) {
        parts.push_back(text(s));
      } else if (is(s, "template_type")) {
        parts.push_back(text(field(s, "name")));
      } else {
        return false;
      }
      first = false;
      n = field(n, "name");
    }
    last = n;
    return !ts_node_is_null(n);
  }

  TypeRef type_of(TSNode t) const {
    if (ts_node_is_null(t)) return {};
    if (is(t, "type_identifier")) return {text(t)};
    if (is(t, "class_specifier") || is(t, "struct_specifier") || is(t, "union_specifier")) {
      TSNode n = field(t, "name");
      return ts_node_is_null(n) ? TypeRef{} : type_of(n);
    }
    if (is(t, "template_type")) {
      const std::string name = text(field(t, "name"));
      // Smart pointers call through to their pointee.
      if (name == "unique_ptr" || name == "shared_ptr" || name == "weak_ptr") {
        TSNode args = field(t, "arguments");
        TSNode first = ts_node_is_null(args) ? args : ts_node_named_child(args, 0);
        if (is(first, "type_descriptor")) return type_of(field(first, "type"));
        return {};
      }
      return {name};
    }
    if (is(t, "qualified_identifier")) {
      std::vector<std::string> parts;
      bool global = false;
      TSNode last{};
      if (!split_qualified(t, parts, global, last)) return {};
      TypeRef inner = type_of(last);
      if (inner.name.empty()) return {};
      if (is(last, "template_type") && inner.name != text(field(last, "name"))) return inner;  // std::unique_ptr<T>
      return {(global ? "::" : "") + join_scope(parts, parts.size()) + "::" + inner.name};
    }
    return {};  // primitive, auto, decltype, dependent
  }

  // The type a variable declared `auto x = value` holds, when the value says so.
  TypeRef type_of_value(TSNode v) const {
    if (is(v, "new_expression") || is(v, "compound_literal_expression")) return type_of(field(v, "type"));
    if (!is(v, "call_expression")) return {};
    TSNode f = field(v, "function");
    TSNode name = f;
    if (is(f, "qualified_identifier")) {
      std::vector<std::string> parts;
      bool global = false;
      if (!split_qualified(f, parts, global, name)) return {};
    }
    if (is(name, "template_function")) {
      const std::string n = text(field(name, "name"));
      if (n == "make_unique" || n == "make_shared") {
        TSNode args = field(name, "arguments");
        TSNode first = ts_node_named_child(args, 0);
        if (is(first, "type_descriptor")) return type_of(field(first, "type"));
      }
      return {};
    }
    if (is(f, "identifier") || is(f, "qualified_identifier")) return {text(f), true};
    return {};
  }

  // The declared name under pointer/reference/array/init declarators.
  TSNode declarator_name(TSNode d) const {
    while (!ts_node_is_null(d)) {
      if (is(d, "identifier") || is(d, "field_identifier")) return d;
      TSNode inner = field(d, "declarator");
      if (ts_node_is_null(inner)) {
        // reference_declarator names its child without a field.
        const uint32_t n = ts_node_named_child_count(d);
        if (n == 0) break;
        inner = ts_node_named_child(d, n - 1);
      }
      d = inner;
    }
    return TSNode{};
  }

  void add_call(CallSite c) {
    if (cur_fn_ < 0) return;  // initializers outside functions have no caller
    c.caller = static_cast<uint32_t>(cur_fn_);
    c.line = node_line_;
    calls_.push_back(std::move(c));
  }

  void visit_children(TSNode n, int depth) {
    for_each_child(n, [&](TSNode ch) { visit(ch, depth + 1); });
  }

  void visit(TSNode n, int depth) {
    if (depth > 4000) return;  // pathological nesting (generated code); the rest of the file still counts
    const char* t = ts_node_type(n);
    if (ts_node_child_count(n) == 0) token_bytes_ += ts_node_end_byte(n) - ts_node_start_byte(n);
    if (std::strcmp(t, "ERROR") == 0) {
      // An ERROR node often wraps well-parsed code around one macro; only its loose tokens went unparsed.
      for_each_child(n, [&](TSNode ch) {
        if (ts_node_child_count(ch) == 0) error_bytes_ += ts_node_end_byte(ch) - ts_node_start_byte(ch);
        visit(ch, depth + 1);
      });
      return;
    }
    if (std::strcmp(t, "preproc_include") == 0) {
      std::string inc = text(field(n, "path"));
      if (inc.size() > 2) using_.includes.push_back(inc.substr(1, inc.size() - 2));
      return;
    }
    if (std::strcmp(t, "comment") == 0 || std::strcmp(t, "string_literal") == 0 ||
        std::strcmp(t, "raw_string_literal") == 0 || std::strcmp(t, "preproc_def") == 0 ||
        std::strcmp(t, "preproc_function_def") == 0)
      return;
    if (std::strcmp(t, "namespace_definition") == 0) return visit_namespace(n, depth);
    if (std::strcmp(t, "class_specifier") == 0 || std::strcmp(t, "struct_specifier") == 0 ||
        std::strcmp(t, "union_specifier") == 0)
      return visit_class(n, depth);
    if (std::strcmp(t, "function_definition") == 0) return visit_function(n, depth);
    if (std::strcmp(t, "using_declaration") == 0) return visit_using(n);
    if (cur_fn_ >= 0) node_line_ = ts_node_start_point(n).row + 1;
    if (std::strcmp(t, "field_declaration") == 0 && cur_fn_ < 0) visit_field(n);
    if (cur_fn_ >= 0) {
      if (std::strcmp(t, "call_expression") == 0)
        visit_call(n);
      else if (std::strcmp(t, "new_expression") == 0 || std::strcmp(t, "compound_literal_expression") == 0)
        add_construct(
            type_of(field(n, "type")).name,
            count_arguments(ts_node_is_null(field(n, "arguments")) ? field(n, "value") : field(n, "arguments")));
      else if (std::strcmp(t, "declaration") == 0)
        visit_local_declaration(n);
      else if (std::strcmp(t, "field_initializer") == 0)
        visit_field_initializer(n);
    }
    visit_children(n, depth);
  }

  void visit_namespace(TSNode n, int depth) {
    TSNode name = field(n, "name");
    size_t pushed = 0;
    if (ts_node_is_null(name)) {
      scope_.push_back({"", false, true});
      pushed = 1;
    } else {
      for (auto& p : split_scope(text(name))) {  // nested_namespace_specifier "a::b"
        scope_.push_back({p, false, false});
        ++pushed;
      }
    }
    TSNode body = field(n, "body");
    if (!ts_node_is_null(body)) visit_children(body, depth);
    scope_.resize(scope_.size() - pushed);
  }

  void visit_class(TSNode n, int depth) {
    TSNode body = field(n, "body");
    TSNode name = field(n, "name");
    if (ts_node_is_null(body) || ts_node_is_null(name)) {
      // A use of the type (`struct Foo* p`), or an anonymous struct: its members belong to the enclosing scope.
      if (!ts_node_is_null(body)) visit_children(body, depth);
      return;
    }
    std::vector<std::string> parts;
    bool global = false;
    TSNode last = name;
    if (is(name, "qualified_identifier") && !split_qualified(name, parts, global, last)) return;
    parts.push_back(is(last, "template_type") ? text(field(last, "name")) : text(last));
    const std::string outer = scope_string();
    const std::string q = qualify(global ? "" : outer, join_scope(parts, parts.size()));
    ClassInfo& ci = classes_[q];
    ci.decl_scope = outer;
    TSNode start = n;
    while (is(ts_node_parent(start), "template_declaration")) start = ts_node_parent(start);
    class_defs_.push_back({q, path_, ts_node_start_point(start).row + 1, text(start)});
    for_each_child(n, [&](TSNode ch) {
      if (!is(ch, "base_class_clause")) return;
      for_each_child(ch, [&](TSNode b) {
        TypeRef r = type_of(b);
        if (!r.name.empty()) ci.bases.push_back(r.name);
      });
    });
    const size_t depth_before = scope_.size();
    for (auto& p : parts) scope_.push_back({p, true, false});
    class_stack_.push_back(q);
    const int saved_fn = cur_fn_;
    cur_fn_ = -1;  // a local class's methods are functions of their own
    visit_children(body, depth);
    cur_fn_ = saved_fn;
    class_stack_.pop_back();
    scope_.resize(depth_before);
  }

  // Data members: their types let `member.f()` resolve.
  void visit_field(TSNode n) {
    if (class_stack_.empty()) return;
    TypeRef type = type_of(field(n, "type"));
    if (type.name.empty()) return;
    for_each_child(n, [&](TSNode ch, const char* f) {
      if (std::strcmp(f, "declarator") != 0 || is(ch, "function_declarator")) return;
      TSNode id = declarator_name(ch);
      if (!ts_node_is_null(id)) classes_[class_stack_.back()].fields[text(id)] = type;
    });
  }

  void visit_using(TSNode n) {
    bool is_namespace = false;
    TSNode target{};
    for_each_child(n, [&](TSNode ch) {
      if (!ts_node_is_named(ch) && text(ch) == "namespace") is_namespace = true;
      if (is(ch, "identifier") || is(ch, "qualified_identifier") || is(ch, "namespace_identifier")) target = ch;
    });
    if (ts_node_is_null(target)) return;
    const std::string what = text(target);
    if (is_namespace)
      using_.directives.emplace_back(scope_string(), what);
    else
      using_.aliases[last_part(what)] = what;
  }

  void visit_function(TSNode n, int depth) {
    TSNode body = field(n, "body");
    TSNode decl = field(n, "declarator");
    while (!ts_node_is_null(decl) && !is(decl, "function_declarator")) {
      TSNode inner = field(decl, "declarator");
      if (ts_node_is_null(inner)) {
        const uint32_t k = ts_node_named_child_count(decl);
        inner = k ? ts_node_named_child(decl, k - 1) : TSNode{};
      }
      decl = inner;
    }
    if (ts_node_is_null(body) || ts_node_is_null(decl)) return;  // = default, = delete, macro soup
    TSNode name = field(decl, "declarator");
    std::vector<std::string> parts;
    bool global = false;
    TSNode last = name;
    if (is(name, "qualified_identifier") && !split_qualified(name, parts, global, last)) return;
    FunctionInfo f;
    f.name = name_text(last);
    if (f.name.empty()) return;
    // No return type and not a constructor: a macro invocation followed by a block (FOREACH(x, v) {...}).
    if (ts_node_is_null(field(n, "type")) && is(last, "identifier")) {
      const std::string owner = !parts.empty()         ? parts.back()
                                : class_stack_.empty() ? ""
                                                       : last_part(class_stack_.back());
      if (f.name != owner) return;
    }
    f.scope = qualify(global ? "" : scope_string(), join_scope(parts, parts.size()));
    f.file = path_;
    bool in_anonymous = false, in_class = !class_stack_.empty();
    for (const auto& s : scope_) in_anonymous |= s.anonymous;
    bool is_static = false;
    for_each_child(n, [&](TSNode ch) {
      if (is(ch, "storage_class_specifier") && text(ch) == "static") is_static = true;
    });
    f.file_local = in_anonymous || (is_static && !in_class && parts.empty());
    // Parameters: defaults lower the minimum; "..." and packs make it open-ended; (void) is none.
    TSNode params = field(decl, "parameters");
    for_each_child(params, [&](TSNode p) {
      if (is(p, "parameter_declaration")) {
        if (ts_node_is_null(field(p, "declarator")) && text(field(p, "type")) == "void") return;
        ++f.min_args;
        ++f.max_args;
      } else if (is(p, "optional_parameter_declaration")) {
        ++f.max_args;
      } else if (is(p, "variadic_parameter_declaration") || (!ts_node_is_named(p) && text(p) == "...")) {
        f.max_args = FunctionInfo::kVariadic;
      }
    });
    // The text: template headers and the comment lines right above belong to the definition.
    TSNode start = n;
    while (is(ts_node_parent(start), "template_declaration")) start = ts_node_parent(start);
    for (TSNode prev = ts_node_prev_sibling(start);
         is(prev, "comment") && ts_node_end_point(prev).row + 1 >= ts_node_start_point(start).row;
         prev = ts_node_prev_sibling(prev))
      start = prev;
    uint32_t a = ts_node_start_byte(start);
    while (a > 0 && (src_[a - 1] == ' ' || src_[a - 1] == '\t')) --a;
    if (a > 0 && src_[a - 1] != '\n') a = ts_node_start_byte(start);  // keep code that shares the line
    f.text = src_.substr(a, ts_node_end_byte(n) - a);
    f.line = ts_node_start_point(start).row + 1;

    const int saved_fn = cur_fn_;
    auto saved_locals = std::move(locals_);
    locals_.clear();
    cur_fn_ = static_cast<int>(functions_.size());
    functions_.push_back(std::move(f));
    for_each_child(params, [&](TSNode p) {
      TSNode id = declarator_name(field(p, "declarator"));
      if (!ts_node_is_null(id)) locals_[text(id)] = type_of(field(p, "type"));
    });
    // Constructor initializers and the body (a function-try-block's handlers are children too).
    for_each_child(n, [&](TSNode ch, const char* fname) {
      if (std::strcmp(fname, "declarator") != 0 && std::strcmp(fname, "type") != 0) visit(ch, depth + 1);
    });
    cur_fn_ = saved_fn;
    locals_ = std::move(saved_locals);
  }

  void visit_call(TSNode n) {
    TSNode fn = field(n, "function");
    const int args = count_arguments(field(n, "arguments"));
    CallSite c;
    c.args = args;
    if (is(fn, "identifier") || is(fn, "template_function")) {
      c.kind = CallKind::kName;
      c.name = name_text(fn);
      if (cast_names().count(c.name)) return;
    } else if (is(fn, "qualified_identifier")) {
      std::vector<std::string> parts;
      TSNode last{};
      if (!split_qualified(fn, parts, c.global, last)) return add_unresolvable();
      c.kind = CallKind::kQualified;
      c.name = name_text(last);
      c.qualifier = join_scope(parts, parts.size());
    } else if (is(fn, "field_expression")) {
      c.kind = CallKind::kMember;
      c.name = name_text(field(fn, "field"));
      TSNode recv = field(fn, "argument");
      if (is(recv, "this")) {
        c.receiver = Receiver::kThis;
      } else if (is(recv, "identifier")) {
        auto it = locals_.find(text(recv));
        if (it != locals_.end()) {
          c.receiver = it->second.name.empty() ? Receiver::kUnknown : Receiver::kType;
          c.qualifier = it->second.name;
          c.guess = it->second.guess;
        } else {
          c.receiver = Receiver::kField;
          c.qualifier = text(recv);
        }
      } else if (is(recv, "field_expression") && is(field(recv, "argument"), "this")) {
        c.receiver = Receiver::kField;
        c.qualifier = text(field(recv, "field"));
      } else {
        c.receiver = Receiver::kUnknown;
      }
    } else {
      return add_unresolvable();  // through a pointer, a returned callable, ...
    }
    if (c.name.empty()) return add_unresolvable();
    add_call(std::move(c));
  }

  // A call site we count but cannot name.
  void add_unresolvable() { add_call(CallSite{}); }

  void add_construct(const std::string& type, int args) {
    CallSite c;
    c.kind = CallKind::kConstruct;
    c.name = type;
    c.args = args;
    add_call(std::move(c));
  }

  void visit_local_declaration(TSNode n) {
    TypeRef type = type_of(field(n, "type"));
    const bool is_auto = is(field(n, "type"), "placeholder_type_specifier");
    for_each_child(n, [&](TSNode d, const char* f) {
      if (std::strcmp(f, "declarator") != 0) return;
      TSNode value = is(d, "init_declarator") ? field(d, "value") : TSNode{};
      TSNode target = is(d, "init_declarator") ? field(d, "declarator") : d;
      TSNode id = declarator_name(target);
      if (ts_node_is_null(id)) return;
      TypeRef t = is_auto && !ts_node_is_null(value) ? type_of_value(value) : type;
      locals_[text(id)] = t;
      // `T x;`, `T x(a, b);` and `T x{a, b};` construct a T (pointers and references do not).
      if (!is(target, "identifier") || type.name.empty()) return;
      if (ts_node_is_null(value) || is(value, "argument_list") || is(value, "initializer_list"))
        add_construct(type.name, count_arguments(value));
    });
  }

  // `Base(args)` or a delegating `Self(args)` in a constructor's initializer list (members resolve to nothing).
  void visit_field_initializer(TSNode n) {
    TSNode name{}, args{};
    for_each_child(n, [&](TSNode ch) {
      if (is(ch, "argument_list") || is(ch, "initializer_list"))
        args = ch;
      else if (ts_node_is_named(ch) && ts_node_is_null(name))
        name = ch;
    });
    if (ts_node_is_null(name)) return;
    TypeRef t = type_of(name);
    if (t.name.empty()) t.name = text(name);
    add_construct(t.name, count_arguments(args));
  }

  struct ScopePart {
    std::string name;
    bool is_class = false;
    bool anonymous = false;
  };

  const std::string& path_;
  const std::string& src_;
  std::vector<FunctionInfo>& functions_;
  std::unordered_map<std::string, ClassInfo>& classes_;
  std::vector<ClassDef>& class_defs_;
  std::vector<CallSite>& calls_;
  FileUsing& using_;
  std::vector<ScopePart> scope_;
  std::vector<std::string> class_stack_;
  int cur_fn_ = -1;
  uint32_t node_line_ = 0;  // the line of the node visited last inside a function: a call's line
  std::unordered_map<std::string, TypeRef> locals_;  // the current function's parameters and locals
  uint64_t error_bytes_ = 0, token_bytes_ = 0;
};

// Name resolution over the whole index (docs/context-graphs.md, "Resolution rules").
class Resolver {
 public:
  // A call site's `from` and `from_using` must be set.
  Resolver(const std::vector<FunctionInfo>& functions, const std::unordered_map<std::string, ClassInfo>& classes)
      : fns_(functions), classes_(classes) {
    for (const auto& [name, ci] : classes_) classes_by_name_[last_part(name)].push_back(name);
    for (uint32_t i = 0; i < fns_.size(); ++i) {
      by_qualified_[fns_[i].qualified()].push_back(i);
      if (classes_.count(fns_[i].scope)) by_method_name_[fns_[i].name].push_back(i);
    }
  }

  std::vector<uint32_t> resolve(const CallSite& c) const {
    const FunctionInfo& caller = caller_fn(c);
    const auto parts = split_scope(caller.scope);
    std::vector<uint32_t> found;
    switch (c.kind) {
      case CallKind::kName:
        if (c.name.empty()) return {};
        found = walk(parts, c.name, c);
        if (found.empty()) {
          const auto& aliases = caller_using(c).aliases;
          if (auto it = aliases.find(c.name); it != aliases.end()) found = walk(parts, it->second, c);
        }
        if (found.empty()) found = via_directives(c.name, c);
        if (found.empty()) return constructors(resolve_class(c.name, parts, c), c);
        return by_arity(found, c.args);
      case CallKind::kQualified: {
        const std::string rel = qualify(c.qualifier, c.name);
        found = c.global ? candidates(rel, c) : walk(parts, rel, c, /*classes=*/false);
        if (found.empty() && !c.global) found = via_directives(rel, c);
        if (!found.empty()) return by_arity(found, c.args);
        // `A::f()` where f is inherited, or `ns::Type(args)`.
        const std::string cls = resolve_class(c.global ? "::" + c.qualifier : c.qualifier, parts, c);
        if (!cls.empty()) {
          found = methods(cls, c.name, c);
          if (!found.empty()) return by_arity(found, c.args);
        }
        return constructors(resolve_class(c.global ? "::" + rel : rel, parts, c), c);
      }
      case CallKind::kMember: return by_arity(member(c, parts), c.args);
      case CallKind::kConstruct: return constructors(resolve_class(c.name, parts, c), c);
    }
    return {};
  }

 private:
  static const FunctionInfo& caller_fn(const CallSite& c) { return *c.from; }
  static const FileUsing& caller_using(const CallSite& c) { return *c.from_using; }

  // Definitions named q that the caller can see (another file's file-local functions are invisible).
  std::vector<uint32_t> candidates(const std::string& q, const CallSite& c) const {
    auto it = by_qualified_.find(q);
    if (it == by_qualified_.end()) return {};
    std::vector<uint32_t> out;
    for (uint32_t i : it->second)
      if (!fns_[i].file_local || fns_[i].file == caller_fn(c).file) out.push_back(i);
    return out;
  }

  // Innermost scope outwards; the first scope that has the name wins (C++ name hiding), before arity is checked.
  // A class scope also searches its bases.
  std::vector<uint32_t> walk(const std::vector<std::string>& parts, const std::string& rel, const CallSite& c,
                             bool class_levels = true) const {
    for (size_t k = parts.size() + 1; k-- > 0;) {
      const std::string prefix = join_scope(parts, k);
      if (class_levels && classes_.count(prefix) && rel.find("::") == std::string::npos) {
        auto m = methods(prefix, rel, c);
        if (!m.empty()) return m;
        continue;
      }
      auto found = candidates(qualify(prefix, rel), c);
      if (!found.empty()) return found;
    }
    return {};
  }

  std::vector<uint32_t> via_directives(const std::string& rel, const CallSite& c) const {
    std::vector<uint32_t> out;
    for (const auto& [scope, ns] : caller_using(c).directives) {
      if (ns.rfind("::", 0) == 0) {
        auto f = candidates(qualify(ns.substr(2), rel), c);
        out.insert(out.end(), f.begin(), f.end());
        continue;
      }
      const auto sp = split_scope(scope);
      for (size_t k = sp.size() + 1; k-- > 0;) {
        auto f = candidates(qualify(qualify(join_scope(sp, k), ns), rel), c);
        if (!f.empty()) {
          out.insert(out.end(), f.begin(), f.end());
          break;
        }
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

  // A class's methods named `name`, or its bases' when it has none. Each class is searched once per lookup: with
  // misparsed or cyclic bases (macro-heavy C read as C++), a depth limit alone left the search exponential in it.
  std::vector<uint32_t> methods(const std::string& cls, const std::string& name, const CallSite& c) const {
    std::unordered_set<std::string> seen;
    return methods(cls, name, c, 0, seen);
  }
  std::vector<uint32_t> methods(const std::string& cls, const std::string& name, const CallSite& c, int depth,
                                std::unordered_set<std::string>& seen) const {
    if (!seen.insert(cls).second) return {};
    auto found = candidates(qualify(cls, name), c);
    if (!found.empty() || depth > 8) return found;
    auto it = classes_.find(cls);
    if (it == classes_.end()) return {};
    const auto decl = split_scope(it->second.decl_scope);
    for (const auto& b : it->second.bases) {
      const std::string base = resolve_class(b, decl, c);
      if (base.empty() || base == cls) continue;
      auto m = methods(base, name, c, depth + 1, seen);
      found.insert(found.end(), m.begin(), m.end());
    }
    return found;
  }

  // The qualified class a type name written in scope `parts` means, or "".
  std::string resolve_class(const std::string& type, const std::vector<std::string>& parts, const CallSite& c) const {
    if (type.empty()) return {};
    if (type.rfind("::", 0) == 0) return classes_.count(type.substr(2)) ? type.substr(2) : std::string();
    for (size_t k = parts.size() + 1; k-- > 0;) {
      const std::string q = qualify(join_scope(parts, k), type);
      if (classes_.count(q)) return q;
    }
    for (const auto& [scope, ns] : caller_using(c).directives) {
      const std::string n = ns.rfind("::", 0) == 0 ? ns.substr(2) : ns;
      if (classes_.count(qualify(n, type))) return qualify(n, type);
    }
    // Not visible from here by the rules, but the only project class of that name: taken, because parse errors
    // around macros often lose a class's namespace, and type aliases hide it.
    auto it = classes_by_name_.find(last_part(type));
    return it != classes_by_name_.end() && it->second.size() == 1 ? it->second[0] : std::string();
  }

  std::vector<uint32_t> constructors(const std::string& cls, const CallSite& c) const {
    if (cls.empty()) return {};
    return by_arity(candidates(qualify(cls, last_part(cls)), c), c.args);
  }

  std::string innermost_class(const std::vector<std::string>& parts) const {
    for (size_t k = parts.size(); k > 0; --k)
      if (classes_.count(join_scope(parts, k))) return join_scope(parts, k);
    return {};
  }

  // The project class of data member `name` of class `cls` or its bases ("" when the member's type is not a
  // project class); found says whether the member exists at all.
  std::string field_class(const std::string& cls, const std::string& name, const CallSite& c, bool& found) const {
    std::unordered_set<std::string> seen;
    return field_class(cls, name, c, 0, found, seen);
  }
  std::string field_class(const std::string& cls, const std::string& name, const CallSite& c, int depth, bool& found,
                          std::unordered_set<std::string>& seen) const {
    if (!seen.insert(cls).second) return {};
    auto it = classes_.find(cls);
    if (it == classes_.end() || depth > 8) return {};
    if (auto f = it->second.fields.find(name); f != it->second.fields.end()) {
      found = true;
      return resolve_class(f->second.name, split_scope(cls), c);
    }
    for (const auto& b : it->second.bases) {
      const std::string base = resolve_class(b, split_scope(it->second.decl_scope), c);
      if (base.empty() || base == cls) continue;
      std::string r = field_class(base, name, c, depth + 1, found, seen);
      if (found) return r;
    }
    return {};
  }

  std::vector<uint32_t> member(const CallSite& c, const std::vector<std::string>& parts) const {
    std::string cls;
    Receiver r = c.receiver;
    if (r == Receiver::kThis) {
      cls = innermost_class(parts);
    } else if (r == Receiver::kType) {
      cls = resolve_class(c.qualifier, parts, c);
      if (cls.empty() && !c.guess) return {};  // a library type (std::vector, ...)
      if (cls.empty()) r = Receiver::kUnknown;
    } else if (r == Receiver::kField) {
      // A data member of the caller's class (or a base); otherwise a global or something unknown.
      bool found = false;
      cls = field_class(innermost_class(parts), c.qualifier, c, found);
      if (found && cls.empty()) return {};  // a member of a library type
      if (!found) r = Receiver::kUnknown;
    }
    if (r == Receiver::kUnknown) {
      // Receiver type unknown: link only when exactly one project method has this name and arity, and the name
      // is not one the standard library's types also have (s.c_str() is far likelier a std::string).
      if (std_member_names().count(c.name)) return {};
      auto it = by_method_name_.find(c.name);
      if (it == by_method_name_.end()) return {};
      std::vector<uint32_t> vis;
      for (uint32_t i : it->second)
        if ((!fns_[i].file_local || fns_[i].file == caller_fn(c).file) && fns_[i].accepts(c.args)) vis.push_back(i);
      return vis.size() == 1 ? vis : std::vector<uint32_t>{};
    }
    return cls.empty() ? std::vector<uint32_t>{} : methods(cls, c.name, c);
  }

  std::vector<uint32_t> by_arity(const std::vector<uint32_t>& in, int args) const {
    std::vector<uint32_t> out;
    for (uint32_t i : in)
      if (fns_[i].accepts(args)) out.push_back(i);
    return out;
  }

  const std::vector<FunctionInfo>& fns_;
  const std::unordered_map<std::string, ClassInfo>& classes_;
  std::unordered_map<std::string, std::vector<uint32_t>> by_qualified_, by_method_name_;
  std::unordered_map<std::string, std::vector<std::string>> classes_by_name_;  // last name -> qualified classes
};

bool is_ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// `class GTEST_API_ TestInfo : public Base {`: an export macro between the class key and the name makes
// tree-sitter misread the whole class as a function. The parser gets a copy with such macros (an all-caps name
// followed by the class name and then `{`, `:`, `;` or `final`) blanked out; the length and so every offset stay.
std::string mask_export_macros(const std::string& src) {
  std::string out;
  auto ident_end = [&](size_t p) {
    while (p < src.size() && is_ident_char(src[p])) ++p;
    return p;
  };
  auto skip_space = [&](size_t p) {
    while (p < src.size() && std::isspace(static_cast<unsigned char>(src[p]))) ++p;
    return p;
  };
  for (size_t p = 0; p < src.size();) {
    if (!is_ident_char(src[p]) || (p > 0 && is_ident_char(src[p - 1]))) {
      ++p;
      continue;
    }
    const size_t e = ident_end(p);
    const std::string_view word(src.data() + p, e - p);
    p = e;
    if (word != "class" && word != "struct" && word != "union") continue;
    const size_t m0 = skip_space(e), m1 = ident_end(m0);
    if (m1 - m0 < 2 || std::isdigit(static_cast<unsigned char>(src[m0]))) continue;
    bool caps = true;
    for (size_t k = m0; k < m1; ++k)
      caps &= std::isupper(static_cast<unsigned char>(src[k])) || std::isdigit(static_cast<unsigned char>(src[k])) ||
              src[k] == '_';
    if (!caps) continue;
    const size_t n0 = skip_space(m1), n1 = ident_end(n0);
    if (n1 == n0) continue;
    size_t after = skip_space(n1);
    if (src.compare(n0, n1 - n0, "final") != 0 && src.compare(after, 5, "final") == 0) after = skip_space(after + 5);
    if (after >= src.size() ||
        !(src[after] == '{' || src[after] == ';' || (src[after] == ':' && src.compare(after, 2, "::") != 0)))
      continue;
    if (out.empty()) out = src;
    std::fill(out.begin() + static_cast<long>(m0), out.begin() + static_cast<long>(m1), ' ');
  }
  return out.empty() ? src : out;
}

struct ParserDeleter {
  void operator()(TSParser* p) const { ts_parser_delete(p); }
};
struct TreeDeleter {
  void operator()(TSTree* t) const { ts_tree_delete(t); }
};

// Does an #include path name this file (relative to the source root)? Either may hold more leading directories
// than the other: "boost/graph/x.hpp" vs "x.hpp", "../include/a.h" vs "include/a.h".
bool path_suffix(const std::string& file, std::string inc) {
  while (inc.rfind("../", 0) == 0 || inc.rfind("./", 0) == 0) inc.erase(0, inc.find('/') + 1);
  const std::string& a = file.size() >= inc.size() ? file : inc;
  const std::string& b = file.size() >= inc.size() ? inc : file;
  return a.compare(a.size() - b.size(), b.size(), b) == 0 &&
         (a.size() == b.size() || a[a.size() - b.size() - 1] == '/');
}

bool is_header_name(const std::string& path) {
  static const char* const kExt[] = {".h", ".hh", ".hpp", ".hxx", ".h++", ".ipp", ".inl", ".tcc"};
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return false;
  const std::string ext = path.substr(dot);
  return std::any_of(std::begin(kExt), std::end(kExt), [&](const char* e) { return ext == e; });
}

// The header's text after its leading comments (// lines, /* */ blocks) and blank lines, cut to whole lines.
std::string header_head(const std::string& src) {
  size_t p = 0;
  for (;;) {
    while (p < src.size() && std::isspace(static_cast<unsigned char>(src[p]))) ++p;
    if (src.compare(p, 2, "//") == 0) {
      p = src.find('\n', p);
      if (p == std::string::npos) return "";
    } else if (src.compare(p, 2, "/*") == 0) {
      p = src.find("*/", p + 2);
      if (p == std::string::npos) return "";
      p += 2;
    } else {
      break;
    }
  }
  while (p > 0 && src[p - 1] != '\n') --p;  // back to the line's start (its indentation)
  size_t end = p;
  for (size_t lines = 0; end < src.size() && lines < ParsedFile::kHeadLines; ++lines) {
    const size_t nl = src.find('\n', end);
    const size_t next = nl == std::string::npos ? src.size() : nl + 1;
    if (next - p > ParsedFile::kHeadBytes) break;
    end = next;
  }
  return src.substr(p, end - p);
}

}  // namespace

struct FileFacts {
  std::vector<FunctionInfo> functions;
  std::unordered_map<std::string, ClassInfo> classes;
  std::vector<ClassDef> class_defs;
  std::vector<CallSite> calls;  // caller: an index into functions
  FileUsing usings;
};

const std::vector<FunctionInfo>& ParsedFile::functions() const {
  static const std::vector<FunctionInfo> none;
  return facts ? facts->functions : none;
}
const std::vector<std::string>& ParsedFile::includes() const {
  static const std::vector<std::string> none;
  return facts ? facts->usings.includes : none;
}

uint32_t FunctionInfo::last_line() const {
  return line + static_cast<uint32_t>(std::count(text.begin(), text.end(), '\n'));
}

struct CppFileParser::Impl {
  CallGraphOptions o;
  std::unique_ptr<TSParser, ParserDeleter> parser{ts_parser_new()};
  double parse_s = 0;  // spent in the parser so far
};

CppFileParser::CppFileParser(CallGraphOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(options);
  if (!ts_parser_set_language(impl_->parser.get(), tree_sitter_cpp()))
    throw Error("tree-sitter-cpp grammar ABI " + std::to_string(ts_language_version(tree_sitter_cpp())) +
                " does not match the tree-sitter runtime");
}
CppFileParser::~CppFileParser() = default;

ParsedFile CppFileParser::parse(const std::string& rel, const std::string& src) {
  const CallGraphOptions& o = impl_->o;
  ParsedFile out;
  out.path = rel;
  out.bytes = src.size();
  auto skip = [&](const std::string& why) {
    out.skipped = why;
    return out;
  };
  if (src.size() > o.max_file_bytes) return skip("larger than " + std::to_string(o.max_file_bytes) + " bytes");
  if (!is_clean_text(src)) return skip("not UTF-8 text (binary or another encoding)");
  if (o.time_budget_s > 0 && impl_->parse_s >= o.time_budget_s)
    return skip("over the graph's parse time budget of " + std::to_string(o.time_budget_s) + " s");
  const std::string masked = mask_export_macros(src);
  const uint64_t limit_ms = o.parse_ms_base + o.parse_ms_per_mb * src.size() / (1u << 20);
  TSParser* parser = impl_->parser.get();
  ts_parser_set_timeout_micros(parser, 1000 * limit_ms);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<TSTree, TreeDeleter> tree(
      ts_parser_parse_string(parser, nullptr, masked.data(), static_cast<uint32_t>(masked.size())));
  impl_->parse_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!tree) {
    ts_parser_reset(parser);
    return skip("the parser gave up after " + std::to_string(limit_ms) + " ms");
  }
  TSNode root = ts_tree_root_node(tree.get());
  auto facts = std::make_shared<FileFacts>();
  FileParser fp(rel, src, facts->functions, facts->classes, facts->class_defs, facts->calls, facts->usings);
  fp.run(root);
  const double error_fraction =
      fp.token_bytes() ? static_cast<double>(fp.error_bytes()) / static_cast<double>(fp.token_bytes()) : 0.0;
  // Macro-heavy headers can be half syntax errors and still hold good functions; only a file that yields none is
  // called unparseable.
  if (error_fraction > o.max_error_fraction && facts->functions.empty()) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * error_fraction);
    return skip(std::string("not parseable as C++ (") + pct + " of its tokens are syntax errors)");
  }
  out.has_errors = ts_node_has_error(root);
  out.facts = std::move(facts);
  if (is_header_name(rel)) out.head = header_head(src);
  return out;
}

struct LinkedGraph::Impl {
  std::vector<std::shared_ptr<const ParsedFile>> files;
  CallGraph g;
  std::vector<const ParsedFile*> file_of;  // per function
  std::unordered_map<std::string, ClassInfo> classes;
  std::unordered_map<std::string, const ClassDef*> class_defs;
  std::unique_ptr<Resolver> resolver;
  // Lookups an editor's request makes: a file by path with its functions' index range, headers by file name.
  std::unordered_map<std::string, std::pair<const ParsedFile*, std::pair<uint32_t, uint32_t>>> by_path;
  std::unordered_multimap<std::string, const ParsedFile*> headers_by_name;

  // Several definitions fit a call (same-arity overloads, one name in many classes): prefer the caller's own file,
  // then the files it includes; past kMaxTargets the call is ambiguous and gets no edge, so that e.g. Boost.Graph's
  // dozens of get(key, map) overloads do not link every caller to all of them.
  std::vector<uint32_t> narrow(std::vector<uint32_t> to, const CallSite& c, bool& ambiguous) const {
    static constexpr size_t kMaxTargets = 4;
    ambiguous = false;
    if (to.size() <= 1) return to;
    const std::string& file = c.from->file;
    auto keep = [&](auto pred) {
      std::vector<uint32_t> sub;
      for (uint32_t t : to)
        if (pred(g.functions[t].file)) sub.push_back(t);
      if (!sub.empty()) to = std::move(sub);
    };
    keep([&](const std::string& f) { return f == file; });
    if (to.size() > 1) {
      const auto& inc = c.from_using->includes;
      keep([&](const std::string& f) {
        return std::any_of(inc.begin(), inc.end(), [&](const std::string& i) { return path_suffix(f, i); });
      });
    }
    if (to.size() > kMaxTargets) {
      ambiguous = true;
      return {};
    }
    return to;
  }
};

LinkedGraph::LinkedGraph(std::vector<std::shared_ptr<const ParsedFile>> files) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.files = std::move(files);
  CallGraph& g = m.g;
  for (const auto& f : m.files) {
    if (!f->facts) {
      ++g.files_skipped;
      g.warnings.push_back(f->path + ": skipped: " + f->skipped);
      continue;
    }
    ++g.files;
    g.bytes += f->bytes;
    if (f->has_errors) ++g.files_with_errors;
    const auto first = static_cast<uint32_t>(g.functions.size());
    for (const auto& fn : f->facts->functions) {
      g.functions.push_back(fn);
      m.file_of.push_back(f.get());
    }
    m.by_path.try_emplace(f->path, f.get(), std::pair{first, static_cast<uint32_t>(g.functions.size())});
    if (!f->head.empty()) m.headers_by_name.emplace(fs::path(f->path).filename().string(), f.get());
    // A class seen in several files (a header parsed once per includer is not: headers are files of their own)
    // keeps the union of what each file says.
    for (const auto& [name, ci] : f->facts->classes) {
      auto [it, fresh] = m.classes.try_emplace(name, ci);
      if (fresh) continue;
      for (const auto& b : ci.bases)
        if (std::find(it->second.bases.begin(), it->second.bases.end(), b) == it->second.bases.end())
          it->second.bases.push_back(b);
      for (const auto& [field, type] : ci.fields) it->second.fields.try_emplace(field, type);
    }
    for (const auto& cd : f->facts->class_defs) m.class_defs.try_emplace(cd.qualified, &cd);
  }
  for (auto& fn : g.functions) fn.is_method = m.classes.count(fn.scope) > 0;
  m.resolver = std::make_unique<Resolver>(g.functions, m.classes);
  const size_t n = g.functions.size();
  g.callees.assign(n, {});
  g.callers.assign(n, {});
  uint32_t base = 0;
  for (const auto& f : m.files) {
    if (!f->facts) continue;
    for (CallSite c : f->facts->calls) {
      c.caller += base;
      c.from = &g.functions[c.caller];
      c.from_using = &f->facts->usings;
      ++g.call_sites;
      bool ambiguous = false;
      auto to = m.narrow(m.resolver->resolve(c), c, ambiguous);
      if (ambiguous) ++g.ambiguous_call_sites;
      if (!to.empty()) ++g.resolved_call_sites;
      for (uint32_t t : to) {
        g.callees[c.caller].push_back(t);
        g.callers[t].push_back(c.caller);
      }
    }
    base += static_cast<uint32_t>(f->facts->functions.size());
  }
  for (auto* lists : {&g.callees, &g.callers})
    for (auto& l : *lists) {
      std::sort(l.begin(), l.end());
      l.erase(std::unique(l.begin(), l.end()), l.end());
    }
}

LinkedGraph::~LinkedGraph() = default;
const CallGraph& LinkedGraph::graph() const {
  return impl_->g;
}
CallGraph LinkedGraph::release() {
  impl_->resolver.reset();
  return std::move(impl_->g);
}
const std::vector<std::shared_ptr<const ParsedFile>>& LinkedGraph::files() const {
  return impl_->files;
}

const ClassDef* LinkedGraph::find_class(const std::string& qualified) const {
  auto it = impl_->class_defs.find(qualified);
  return it == impl_->class_defs.end() ? nullptr : it->second;
}

const ParsedFile* LinkedGraph::file(const std::string& path) const {
  auto it = impl_->by_path.find(path);
  return it == impl_->by_path.end() ? nullptr : it->second.first;
}

std::vector<uint32_t> LinkedGraph::functions_of(const std::string& path) const {
  std::vector<uint32_t> out;
  if (auto it = impl_->by_path.find(path); it != impl_->by_path.end())
    for (uint32_t i = it->second.second.first; i < it->second.second.second; ++i) out.push_back(i);
  return out;
}

const ParsedFile* LinkedGraph::header_for(const std::string& include, const std::string& except) const {
  const ParsedFile* best = nullptr;
  // Every file an include names ends in the include's last component.
  auto [a, b] = impl_->headers_by_name.equal_range(fs::path(include).filename().string());
  for (auto it = a; it != b; ++it) {
    const ParsedFile* f = it->second;
    if (f->path != except && include_names(f->path, include) &&
        (!best || f->path.size() < best->path.size() || (f->path.size() == best->path.size() && f->path < best->path)))
      best = f;
  }
  return best;
}

std::vector<ResolvedCall> LinkedGraph::resolve_calls(const ParsedFile& buffer, size_t fn) const {
  std::vector<ResolvedCall> out;
  if (!buffer.facts || fn >= buffer.facts->functions.size()) return out;
  for (CallSite c : buffer.facts->calls) {
    if (c.caller != fn) continue;
    c.from = &buffer.facts->functions[fn];
    c.from_using = &buffer.facts->usings;
    bool ambiguous = false;
    for (uint32_t t : impl_->narrow(impl_->resolver->resolve(c), c, ambiguous))
      if (std::none_of(out.begin(), out.end(), [&](const ResolvedCall& r) { return r.function == t; }))
        out.push_back({t, c.line});
  }
  return out;
}

bool include_names(const std::string& file, const std::string& include) {
  return path_suffix(file, include);
}

CallGraph build_call_graph(const std::vector<std::pair<std::string, std::string>>& files,
                           const CallGraphOptions& options) {
  CppFileParser parser(options);
  std::vector<std::shared_ptr<const ParsedFile>> parsed;
  for (const auto& [path, src] : files) parsed.push_back(std::make_shared<ParsedFile>(parser.parse(path, src)));
  return LinkedGraph(std::move(parsed)).release();
}

CallGraph build_call_graph(const CallGraphOptions& o, const ProgressFn& progress) {
  std::error_code ec;
  if (!fs::is_directory(o.src_dir, ec)) throw Error("graphs: source directory not found: " + o.src_dir);
  std::vector<std::pair<std::string, uint64_t>> files;  // relative path, size
  uint64_t total = 0;
  const fs::path root(o.src_dir);
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
    const std::string rel = fs::relative(it->path(), root, ec).generic_string();
    if (!is_cpp_source_name(rel)) continue;
    if (std::any_of(o.exclude.begin(), o.exclude.end(),
                    [&](const std::string& x) { return rel.find(x) != std::string::npos; }))
      continue;
    const uint64_t size = it->file_size(ec);
    files.emplace_back(rel, size);
    total += size;
  }
  if (files.empty()) throw Error("graphs: no C++ sources (.cc .cpp .h .hpp ...) under " + o.src_dir);
  std::sort(files.begin(), files.end());
  CppFileParser parser(o);
  std::vector<std::shared_ptr<const ParsedFile>> parsed;
  uint64_t done = 0;
  for (const auto& [rel, size] : files) {
    try {
      parsed.push_back(std::make_shared<ParsedFile>(parser.parse(rel, read_file_bytes((root / rel).string()))));
    } catch (const Error& e) {
      ParsedFile unread;
      unread.path = rel;
      unread.skipped = "cannot read";
      parsed.push_back(std::make_shared<ParsedFile>(std::move(unread)));
    }
    done += size;
    if (progress) progress(done, total);
  }
  return LinkedGraph(std::move(parsed)).release();
}

}  // namespace slm::data
