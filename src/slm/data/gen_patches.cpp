#include "slm/data/gen_patches.h"

#include <dirent.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <iterator>
#include <sstream>

#include "slm/data/corpus.h"
#include "slm/data/text.h"

namespace slm::data {

namespace {

std::string trim(const std::string& s) {
  return std::string(trim_space(s));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    out.push_back(std::move(l));
  }
  return out;
}

// "Field: value" with a header-like name (letters, digits, '-'), or "" when the line is not one.
std::string field_name(const std::string& line) {
  const size_t colon = line.find(':');
  if (colon == std::string::npos || colon == 0 || colon > 24) return "";
  for (size_t i = 0; i < colon; ++i)
    if (!std::isalnum(static_cast<unsigned char>(line[i])) && line[i] != '-') return "";
  return ascii_lower(line.substr(0, colon));
}

bool is_diff_start(const std::vector<std::string>& lines, size_t i) {
  const auto& l = lines[i];
  if (l.starts_with("diff --git ") || l.starts_with("Index: ") || l.starts_with("diff -")) return true;
  return l.starts_with("--- ") && i + 1 < lines.size() && lines[i + 1].starts_with("+++ ");
}

// "[PATCH 2/3] Fix x" -> "Fix x".
std::string strip_patch_tag(std::string s) {
  s = trim(s);
  if (s.starts_with("[")) {
    const size_t e = s.find(']');
    if (e != std::string::npos) s = trim(s.substr(e + 1));
  }
  return s;
}

bool code_file(const std::string& path) {
  const std::string p = "/" + path;
  return domain_accepts("cpp", p, "") || domain_accepts("cmake", p, "") || p.ends_with(".c") || p.ends_with(".sh") ||
         p.ends_with("/Makefile") || p.ends_with(".am") || p.ends_with(".ac") || p.ends_with(".in") ||
         p.ends_with(".pro") || p.ends_with(".py");
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The series file's patch names (comments and quilt options dropped), else every file in the directory.
std::vector<std::string> patch_names(const std::string& dir) {
  std::vector<std::string> names;
  std::ifstream series(dir + "/series");
  std::string line;
  while (std::getline(series, line)) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    names.push_back(line.substr(0, line.find_first_of(" \t")));
  }
  if (!names.empty()) return names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != ".." && n != "series" && n != "README") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string package_version(const std::string& dir, std::string& name) {
  // debian/changelog's first line: "name (version) suite; urgency=...".
  std::ifstream in(dir + "/debian/changelog");
  std::string line;
  std::getline(in, line);
  const size_t open = line.find(" ("), close = line.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  if (name.empty()) name = line.substr(0, open);
  return line.substr(open + 2, close - open - 2);
}

}  // namespace

ParsedPatch parse_patch(const std::string& text) {
  ParsedPatch p;
  const auto lines = lines_of(text);
  size_t diff_at = lines.size();
  for (size_t i = 0; i < lines.size(); ++i)
    if (is_diff_start(lines, i)) {
      diff_at = i;
      break;
    }
  // The description: Description/Subject fields with their continuation lines, then free text; git's "---" ends
  // the message (a diffstat follows).
  static const std::array<std::string, 18> dropped = {
      "origin",           "bug",       "bug-debian", "bug-ubuntu",  "forwarded", "last-update",
      "author",           "from",      "date",       "reviewed-by", "acked-by",  "signed-off-by",
      "applied-upstream", "change-id", "cc",         "index",       "x-git-url", "co-authored-by"};
  std::vector<std::string> desc;
  bool in_field = false, keep_field = false;
  for (size_t i = 0; i < diff_at; ++i) {
    const std::string& l = lines[i];
    if (l == "---" || l.starts_with("--- ")) break;  // git's message end (diffstat below), or a quilt separator
    if (l.starts_with("From ") && l.size() > 45 && std::all_of(l.begin() + 5, l.begin() + 45, [](char c) {
          return std::isxdigit(static_cast<unsigned char>(c)) != 0;
        }))
      continue;
    if (in_field && (l.starts_with(" ") || l.starts_with("\t")) && !trim(l).empty()) {
      if (keep_field) desc.push_back(trim(l) == "." ? "" : trim(l));
      continue;
    }
    in_field = false;
    const std::string f = field_name(l);
    if (!f.empty()) {
      const bool is_desc = f == "description" || f == "subject";
      const bool known = is_desc || std::find(dropped.begin(), dropped.end(), f) != dropped.end() ||
                         f.starts_with("bug-") || f.starts_with("x-");
      if (known) {
        in_field = true;
        keep_field = is_desc;
        if (is_desc) desc.push_back(strip_patch_tag(l.substr(l.find(':') + 1)));
        continue;
      }
    }
    if (l.find("This patch header follows DEP-3") != std::string::npos) continue;
    desc.push_back(trim(l));
  }
  while (!desc.empty() && desc.front().empty()) desc.erase(desc.begin());
  while (!desc.empty() && desc.back().empty()) desc.pop_back();
  if (!desc.empty()) {
    p.subject = desc.front();
    std::string body;
    for (size_t i = 1; i < desc.size(); ++i) body += desc[i] + "\n";
    p.body = trim(body);
  }
  for (size_t i = diff_at; i < lines.size(); ++i) {
    p.diff += lines[i] + "\n";
    if (lines[i].starts_with("+++ ")) {
      std::string f = lines[i].substr(4);
      f = f.substr(0, f.find('\t'));
      f = trim(f);
      if (f == "/dev/null") continue;
      if (f.starts_with("b/") || f.starts_with("a/"))
        f = f.substr(2);
      else if (const size_t slash = f.find('/'); slash != std::string::npos && f.find('/') != 0)
        f = f.substr(slash + 1);  // "pkg-1.0.orig/src/x.c" style: the first component is the tree's name
      p.files.push_back(f);
    }
  }
  return p;
}

std::string classify_patch(const ParsedPatch& p) {
  const std::string d = " " + ascii_lower(p.subject + "\n" + p.body) + " ";
  struct Category {
    const char* name;
    std::vector<const char*> words;
  };
  // The first category with a matching phrase wins, most specific first.
  static const std::vector<Category> categories = {
      {"memory",
       {"use-after-free", "use after free", "buffer overflow", "buffer overrun",  "out-of-bounds", "out of bounds",
        "heap overflow",  "stack overflow", "double free",     "double-free",     "memory leak",   "leaks memory",
        "leaking memory", "leaked memory",  "resource leak",   "descriptor leak", "fd leak",       "addresssanitizer",
        "asan",           "valgrind",       "invalid read",    "invalid write",   "dangling"}},
      {"undefined-behavior",
       {"undefined behavior", "undefined behaviour", "ubsan", "integer overflow", "signed overflow", "uninitialized",
        "uninitialised", "uninitialized value", "strict aliasing", "strict-aliasing", "misaligned", "unaligned access",
        "shift exponent", "sequence point"}},
      {"concurrency",
       {"race condition", "data race", "deadlock", "thread-safe", "thread safe", "threadsanitizer", "tsan", "mutex"}},
      {"crash",
       {"crash", "crashes", "crashing", "segfault", "segfaults", "segmentation fault", "sigsegv", "null pointer",
        "nullptr dereference", "null dereference", "dereference", "dereferencing", "sigabrt", "assertion failure",
        "assertion failed", "abort", "aborts"}},
      {"build",
       {"ftbfs",
        "fails to build",
        "failed to build",
        "build failure",
        "build failures",
        "fix build",
        "fix the build",
        "build fix",
        "compile error",
        "compilation error",
        "compilation failure",
        "compilation failures",
        "fails to compile",
        "does not compile",
        "doesn't compile",
        "gcc-10",
        "gcc-11",
        "gcc-12",
        "gcc-13",
        "gcc-14",
        "gcc 10",
        "gcc 11",
        "gcc 12",
        "gcc 13",
        "gcc 14",
        "gcc13",
        "gcc12",
        "missing include",
        "missing #include",
        "missing header",
        "-werror",
        "undefined reference",
        "link error",
        "linker error",
        "link failure",
        "c++17",
        "c++20",
        "c++11",
        "error:",
        "narrowing conversion",
        "implicit declaration",
        "incomplete type"}}};
  // Whole words only: "asan" is not in "pleasant", "abort" not in "aborted" ... (a word ending in '-' or ':' is
  // a prefix by design: "gcc-1" for gcc-10..14).
  auto word_at = [&](const std::string& w) {
    auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
    for (size_t at = d.find(w); at != std::string::npos; at = d.find(w, at + 1)) {
      const bool start_ok = !alnum(w.front()) || at == 0 || !alnum(d[at - 1]);
      const bool end_ok = !alnum(w.back()) || at + w.size() >= d.size() || !alnum(d[at + w.size()]);
      if (start_ok && end_ok) return true;
    }
    return false;
  };
  for (const auto& c : categories)
    for (const char* w : c.words)
      if (word_at(w)) return c.name;
  return "";
}

nlohmann::json PatchStats::to_json() const {
  return {{"packages", packages}, {"patches", patches},     {"no_description", no_description},
          {"no_code", no_code},   {"too_large", too_large}, {"license_not_allowed", license},
          {"debug", debug},       {"review", review},       {"debug_categories", categories}};
}

PatchCorpus generate_patch_corpus(const std::vector<std::string>& package_dirs, const LicensePolicy& licenses,
                                  uint64_t max_patch_bytes, PatchStats* stats) {
  PatchCorpus out;
  PatchStats st;
  for (const auto& dir : package_dirs) {
    const std::string patches = dir + "/debian/patches";
    const auto names = patch_names(patches);
    if (names.empty()) continue;
    std::string name, license;
    std::ifstream ctl(dir + "/debian/control");
    for (std::string l; std::getline(ctl, l);)
      if (l.starts_with("Source:")) {
        name = trim(l.substr(7));
        break;
      }
    const std::string version = package_version(dir, name);
    if (name.empty()) continue;
    ++st.packages;
    const auto copyright = DebianCopyright::read(dir + "/debian/copyright");
    for (const auto& n : names) {
      const std::string path = patches + "/" + n;
      const std::string text = read_all(path);
      if (text.empty()) continue;
      ++st.patches;
      if (text.size() > max_patch_bytes) {
        ++st.too_large;
        continue;
      }
      if (!is_clean_text(text)) continue;
      const ParsedPatch p = parse_patch(text);
      if (p.subject.size() < 8) {
        ++st.no_description;
        continue;
      }
      if (p.files.empty() || std::none_of(p.files.begin(), p.files.end(), code_file)) {
        ++st.no_code;
        continue;
      }
      if (std::any_of(p.files.begin(), p.files.end(),
                      [&](const std::string& f) { return !licenses.allows(copyright.license_of(f)); })) {
        ++st.license;
        continue;
      }
      const std::string category = classify_patch(p);
      std::string files;
      for (size_t i = 0; i < p.files.size(); ++i) files += (i ? ", " : "") + p.files[i];
      GeneratedDoc d;
      d.meta.package = name;
      d.meta.path = "debian/patches/" + n;
      d.meta.license = copyright.license_of(p.files.front());
      d.split_key = "package:" + name;
      d.extra = {{"version", version}, {"category", category}};
      std::ostringstream t;
      if (!category.empty()) {
        d.meta.domain = "debug";
        t << "Bug: " << p.subject << "\nProject: " << name << " " << version << "\nKind: " << category
          << "\nFiles: " << files << "\n\nSymptom:\n"
          << p.subject << "\n";
        if (!p.body.empty()) t << "\nDiagnosis:\n" << p.body << "\n";
        t << "\nFix:\n" << p.diff;
        d.text = t.str();
        ++st.debug;
        ++st.categories[category];
        out.debug.push_back(std::move(d));
      } else {
        d.meta.domain = "review";
        t << "Change to " << name << " " << version << " (" << files << ")\n\n"
          << p.diff << "\nReview:\n"
          << p.subject << "\n";
        if (!p.body.empty()) t << p.body << "\n";
        d.text = t.str();
        ++st.review;
        out.review.push_back(std::move(d));
      }
    }
  }
  if (stats) *stats = st;
  return out;
}

}  // namespace slm::data
