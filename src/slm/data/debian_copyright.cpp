#include "slm/data/debian_copyright.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "slm/data/text.h"
#include "slm/util/error.h"

namespace slm::data {

namespace {

// One deb822 paragraph: field name (lower case) -> value, continuation lines joined with '\n'.
struct Paragraph {
  std::vector<std::pair<std::string, std::string>> fields;
  const std::string* get(std::string_view name) const {
    for (const auto& [k, v] : fields)
      if (k == name) return &v;
    return nullptr;
  }
};

std::vector<Paragraph> paragraphs(std::string_view text) {
  std::vector<Paragraph> out;
  Paragraph cur;
  auto flush = [&] {
    if (!cur.fields.empty()) out.push_back(std::move(cur));
    cur = {};
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = end + 1;
    if (trim_space(line).empty()) {
      flush();
      if (end == text.size()) break;
      continue;
    }
    if (line.front() == '#') continue;
    if (line.front() == ' ' || line.front() == '\t') {
      if (!cur.fields.empty()) cur.fields.back().second += "\n" + std::string(trim_space(line));
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // not deb822: ignored, the guess decides
    cur.fields.emplace_back(ascii_lower(trim_space(line.substr(0, colon))),
                            std::string(trim_space(line.substr(colon + 1))));
    if (end == text.size()) break;
  }
  flush();
  return out;
}

// The short name: the first line of a License field.
std::string short_name(const std::string& value) {
  return std::string(trim_space(value.substr(0, value.find('\n'))));
}

std::string guess_license(std::string_view all) {
  if (all.find("Runtime Library Exception") != std::string_view::npos) return "GPL-3+ with GCC-exception-3.1";
  if (all.find("Boost Software License") != std::string_view::npos) return "BSL-1.0";
  if (all.find("Apache License") != std::string_view::npos) return "Apache-2.0";
  if (all.find("GNU Lesser General Public License") != std::string_view::npos ||
      all.find("GNU Library General Public License") != std::string_view::npos)
    return "LGPL";
  if (all.find("GNU General Public License") != std::string_view::npos) return "GPL";
  if (all.find("Permission is hereby granted, free of charge") != std::string_view::npos) return "Expat";
  if (all.find("Redistribution and use in source and binary forms") != std::string_view::npos) return "BSD";
  return "";
}

bool match_at(std::string_view p, std::string_view s) {
  // Iterative glob with one backtrack point for the last '*' (any run, '/' included).
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
      continue;
    }
    if (pi < p.size()) {
      char pc = p[pi];
      size_t step = 1;
      bool any = pc == '?';
      if (pc == '\\' && pi + 1 < p.size()) {
        pc = p[pi + 1];
        step = 2;
        any = false;
      }
      if (any || pc == s[si]) {
        pi += step;
        ++si;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    pi = star + 1;
    si = ++mark;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace

bool dep5_match(std::string_view pattern, std::string_view path) {
  if (pattern.starts_with("./")) pattern.remove_prefix(2);
  if (path.starts_with("./")) path.remove_prefix(2);
  if (!pattern.empty() && pattern.back() == '/') return path.starts_with(pattern);
  return match_at(pattern, path);
}

DebianCopyright DebianCopyright::parse(std::string_view text) {
  DebianCopyright c;
  c.guess_ = guess_license(text);
  const auto paras = paragraphs(text);
  if (paras.empty()) return c;
  const bool dep5 = paras.front().get("format") != nullptr;
  c.machine_readable_ = dep5;
  for (size_t i = 0; i < paras.size(); ++i) {
    const auto* lic = paras[i].get("license");
    if (!lic || short_name(*lic).empty()) continue;
    const std::string name = short_name(*lic);
    if (c.first_license_.empty()) c.first_license_ = name;
    const auto* files = paras[i].get("files");
    if (dep5 && files) {
      Stanza st;
      st.license = name;
      std::string_view rest = *files;
      while (!rest.empty()) {
        const size_t b = rest.find_first_not_of(" \t\n");
        if (b == std::string_view::npos) break;
        const size_t e = rest.find_first_of(" \t\n", b);
        st.patterns.emplace_back(rest.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
        rest = e == std::string_view::npos ? std::string_view{} : rest.substr(e);
      }
      c.stanzas_.push_back(std::move(st));
    } else if (dep5 && i == 0) {
      c.header_license_ = name;
    }
  }
  return c;
}

DebianCopyright DebianCopyright::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(text);
}

std::string DebianCopyright::license_of(std::string_view relative_path) const {
  for (auto it = stanzas_.rbegin(); it != stanzas_.rend(); ++it)
    for (const auto& p : it->patterns)
      if (dep5_match(p, relative_path)) return it->license;
  if (!header_license_.empty()) return header_license_;
  if (!machine_readable_ && !first_license_.empty()) return first_license_;
  return guess_;
}

std::string DebianCopyright::main_license() const {
  for (const auto& st : stanzas_)
    if (std::find(st.patterns.begin(), st.patterns.end(), "*") != st.patterns.end()) return st.license;
  if (!header_license_.empty()) return header_license_;
  if (!first_license_.empty()) return first_license_;
  return guess_;
}

// ---------------------------------------------------------------------------------------------- policy

std::string normalize_license_name(std::string_view name) {
  std::string n = ascii_lower(trim_space(name));
  bool changed = true;
  while (changed && !n.empty()) {
    changed = false;
    for (std::string_view suffix : {"+", "-only", "-or-later", ".0"})
      if (n.size() > suffix.size() && n.ends_with(suffix)) {
        n.resize(n.size() - suffix.size());
        changed = true;
      }
  }
  return std::string(trim_space(n));
}

LicensePolicy::LicensePolicy(std::vector<std::string> allowed) {
  for (auto& a : allowed) {
    const bool prefix = !a.empty() && a.back() == '*';
    std::string n =
        prefix ? ascii_lower(trim_space(std::string_view(a).substr(0, a.size() - 1))) : normalize_license_name(a);
    if (!n.empty()) allowed_.push_back(prefix ? n + "*" : n);
  }
}

LicensePolicy LicensePolicy::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("allowed") || !j["allowed"].is_array())
    throw Error(where + ": expected {\"allowed\": [license names]}");
  std::vector<std::string> names;
  for (const auto& v : j["allowed"]) {
    if (!v.is_string()) throw Error(where + ": \"allowed\" must hold strings, found " + v.dump());
    names.push_back(v.get<std::string>());
  }
  if (names.empty()) throw Error(where + ": \"allowed\" is empty: no file could enter a corpus");
  return LicensePolicy(std::move(names));
}

bool LicensePolicy::allows_name(std::string name) const {
  // "GPL-2+ with OpenSSL exception": an exception only grants more.
  const std::string l = ascii_lower(name);
  if (const size_t w = l.find(" with "); w != std::string::npos) name = name.substr(0, w);
  const std::string n = normalize_license_name(name);
  if (n.empty()) return false;
  for (const auto& a : allowed_) {
    if (a.back() == '*' ? n.starts_with(std::string_view(a).substr(0, a.size() - 1)) : n == a) return true;
  }
  return false;
}

bool LicensePolicy::allows(std::string_view expression) const {
  // "or" binds loosest, then "and" (or a comma): GPL-2+ or (BSD-3-clause and MIT).
  std::string e = std::string(trim_space(expression));
  if (e.empty()) return false;
  for (char& c : e)
    if (c == '(' || c == ')') c = ' ';
  const std::string le = ascii_lower(e);
  auto split = [](const std::string& s, const std::string& ls, const std::vector<std::string>& seps) {
    std::vector<std::string> parts;
    size_t start = 0, i = 0;
    while (i < s.size()) {
      bool hit = false;
      for (const auto& sep : seps)
        if (ls.compare(i, sep.size(), sep) == 0) {
          parts.push_back(s.substr(start, i - start));
          i += sep.size();
          start = i;
          hit = true;
          break;
        }
      if (!hit) ++i;
    }
    parts.push_back(s.substr(start));
    return parts;
  };
  for (const auto& alternative : split(e, le, {" or ", " | "})) {
    bool all = true, any_part = false;
    for (const auto& part : split(alternative, ascii_lower(alternative), {" and ", ","})) {
      if (trim_space(part).empty()) continue;
      any_part = true;
      if (!allows_name(std::string(trim_space(part)))) {
        all = false;
        break;
      }
    }
    if (all && any_part) return true;
  }
  return false;
}

}  // namespace slm::data
