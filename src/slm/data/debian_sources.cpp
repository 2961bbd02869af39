#include "slm/data/debian_sources.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "slm/data/debian_copyright.h"
#include "slm/data/text.h"
#include "slm/util/error.h"

namespace slm::data {

namespace {

// "libfoo-dev (>= 1.2) [amd64] <!nocheck>" -> "libfoo-dev"; "python3:any" -> "python3".
std::string dependency_name(std::string_view d) {
  d = trim_space(d);
  const size_t end = d.find_first_of(" \t\n([<");
  std::string_view n = d.substr(0, end);
  if (const size_t colon = n.find(':'); colon != std::string_view::npos) n = n.substr(0, colon);
  return std::string(n);
}

void add_dependencies(std::string_view field, std::vector<std::string>& out) {
  size_t start = 0;
  for (size_t i = 0; i <= field.size(); ++i) {
    if (i == field.size() || field[i] == ',' || field[i] == '|') {
      std::string n = dependency_name(field.substr(start, i - start));
      if (!n.empty() && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(std::move(n));
      start = i + 1;
    }
  }
}

// The sum of the sizes in a "Files" field: " md5 size name" per continuation line.
uint64_t files_bytes(std::string_view field) {
  uint64_t total = 0;
  std::istringstream in{std::string(field)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string sum, name;
    uint64_t size = 0;
    if (w >> sum >> size >> name) total += size;
  }
  return total;
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return dep5_match(p, name); });
}

std::vector<std::string> string_list(const nlohmann::json& j, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (!j.contains(key)) return out;
  if (!j[key].is_array()) throw Error(where + ": \"" + key + "\" must be a list of strings");
  for (const auto& v : j[key]) {
    if (!v.is_string()) throw Error(where + ": \"" + key + "\" must be a list of strings, found " + v.dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

// dpkg's comparison of one part (upstream or revision): alternating non-digit and digit runs.
int order(char c) {
  if (std::isdigit(static_cast<unsigned char>(c))) return 0;
  if (std::isalpha(static_cast<unsigned char>(c))) return c;
  if (c == '~') return -1;
  return c ? c + 256 : 0;
}

int compare_part(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    int first_diff = 0;
    while ((i < a.size() && !std::isdigit(static_cast<unsigned char>(a[i]))) ||
           (j < b.size() && !std::isdigit(static_cast<unsigned char>(b[j])))) {
      const int ac = i < a.size() ? order(a[i]) : 0;
      const int bc = j < b.size() ? order(b[j]) : 0;
      if (ac != bc) return ac - bc;
      ++i;
      ++j;
    }
    while (i < a.size() && a[i] == '0') ++i;
    while (j < b.size() && b[j] == '0') ++j;
    while (i < a.size() && std::isdigit(static_cast<unsigned char>(a[i])) && j < b.size() &&
           std::isdigit(static_cast<unsigned char>(b[j]))) {
      if (!first_diff) first_diff = a[i] - b[j];
      ++i;
      ++j;
    }
    if (i < a.size() && std::isdigit(static_cast<unsigned char>(a[i]))) return 1;
    if (j < b.size() && std::isdigit(static_cast<unsigned char>(b[j]))) return -1;
    if (first_diff) return first_diff;
  }
  return 0;
}

}  // namespace

int compare_debian_versions(std::string_view a, std::string_view b) {
  auto split = [](std::string_view v, long& epoch, std::string_view& up, std::string_view& rev) {
    epoch = 0;
    if (const size_t c = v.find(':'); c != std::string_view::npos) {
      epoch = std::strtol(std::string(v.substr(0, c)).c_str(), nullptr, 10);
      v = v.substr(c + 1);
    }
    const size_t d = v.rfind('-');
    up = d == std::string_view::npos ? v : v.substr(0, d);
    rev = d == std::string_view::npos ? std::string_view{} : v.substr(d + 1);
  };
  long ea = 0, eb = 0;
  std::string_view ua, ub, ra, rb;
  split(a, ea, ua, ra);
  split(b, eb, ub, rb);
  if (ea != eb) return ea < eb ? -1 : 1;
  if (const int c = compare_part(ua, ub)) return c;
  return compare_part(ra, rb);
}

std::vector<SourcePackage> parse_sources_index(std::istream& in) {
  std::map<std::string, SourcePackage> by_name;
  SourcePackage cur;
  std::string field, value, line;
  auto end_field = [&] {
    if (field == "package")
      cur.name = std::string(trim_space(value));
    else if (field == "version")
      cur.version = std::string(trim_space(value));
    else if (field == "section")
      cur.section = std::string(trim_space(value));
    else if (field == "directory")
      cur.directory = std::string(trim_space(value));
    else if (field == "build-depends" || field == "build-depends-arch" || field == "build-depends-indep")
      add_dependencies(value, cur.build_depends);
    else if (field == "files")
      cur.bytes = files_bytes(value);
    field.clear();
    value.clear();
  };
  auto end_paragraph = [&] {
    end_field();
    if (!cur.name.empty() && !cur.version.empty()) {
      auto it = by_name.find(cur.name);
      if (it == by_name.end())
        by_name.emplace(cur.name, std::move(cur));
      else if (compare_debian_versions(cur.version, it->second.version) > 0)
        it->second = std::move(cur);
    }
    cur = {};
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim_space(line).empty()) {
      end_paragraph();
      continue;
    }
    if (line[0] == ' ' || line[0] == '\t') {
      value += "\n" + line;
      continue;
    }
    end_field();
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    field = line.substr(0, colon);
    for (char& c : field) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    value = line.substr(colon + 1);
  }
  end_paragraph();
  std::vector<SourcePackage> out;
  out.reserve(by_name.size());
  for (auto& [_, p] : by_name) out.push_back(std::move(p));
  return out;
}

SelectionRules SelectionRules::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": expected an object");
  static const std::vector<std::string> known = {"build_depends_any", "include", "exclude", "max_mb", "min_cpp_files"};
  for (const auto& [k, _] : j.items())
    if (std::find(known.begin(), known.end(), k) == known.end())
      throw Error(where + ": unknown field \"" + k +
                  "\" (known: build_depends_any, include, exclude, max_mb, "
                  "min_cpp_files)");
  SelectionRules r;
  r.build_depends_any = string_list(j, "build_depends_any", where);
  r.include = string_list(j, "include", where);
  r.exclude = string_list(j, "exclude", where);
  if (r.build_depends_any.empty() && r.include.empty())
    throw Error(where + ": neither \"build_depends_any\" nor \"include\" names a package: nothing would be taken");
  if (j.contains("max_mb")) {
    if (!j["max_mb"].is_number() || j["max_mb"].get<double>() < 0)
      throw Error(where + ": \"max_mb\" must be a number >= 0");
    r.max_bytes = static_cast<uint64_t>(j["max_mb"].get<double>() * 1e6);
  }
  if (j.contains("min_cpp_files")) {
    if (!j["min_cpp_files"].is_number_integer() || j["min_cpp_files"].get<int>() < 0)
      throw Error(where + ": \"min_cpp_files\" must be an integer >= 0");
    r.min_cpp_files = j["min_cpp_files"].get<int>();
  }
  return r;
}

std::string selection_verdict(const SourcePackage& p, const SelectionRules& r) {
  if (matches_any(p.name, r.exclude)) return "excluded by name";
  if (matches_any(p.name, r.include)) return "";
  if (r.max_bytes && p.bytes > r.max_bytes)
    return "download of " + std::to_string(p.bytes / 1000000) + " MB over the limit of " +
           std::to_string(r.max_bytes / 1000000) + " MB";
  for (const auto& d : p.build_depends)
    if (matches_any(d, r.build_depends_any)) return "";
  return "no build dependency matches";
}

std::vector<ListedPackage> read_package_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot read the package list");
  std::vector<ListedPackage> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string_view t = trim_space(line);
    if (t.empty() || t.front() == '#') continue;
    std::istringstream w{std::string(t)};
    ListedPackage p;
    std::string extra;
    if (!(w >> p.name >> p.version) || (w >> p.bytes, w.fail() && !w.eof()) || (w >> extra))
      throw Error(path + ":" + std::to_string(n) + ": expected \"NAME VERSION [BYTES]\", found \"" + std::string(t) +
                  "\"");
    out.push_back(std::move(p));
  }
  return out;
}

std::string format_package_list(const std::vector<ListedPackage>& packages, const std::string& header_comment) {
  std::ostringstream o;
  std::istringstream h(header_comment);
  std::string line;
  while (std::getline(h, line)) o << "# " << line << "\n";
  for (const auto& p : packages) o << p.name << " " << p.version << " " << p.bytes << "\n";
  return o.str();
}

}  // namespace slm::data
