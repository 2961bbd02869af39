#pragma once
// Debian's source-package index (the "Sources" file apt downloads for a deb-src entry), the rules that pick the
// packages a corpus is built from, and the package list that makes a corpus reproducible.
#include <cstdint>
#include <istream>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace slm::data {

struct SourcePackage {
  std::string name, version, section, directory;
  // Every package named in Build-Depends, Build-Depends-Arch and Build-Depends-Indep (alternatives included),
  // without versions, architectures, build profiles or ":any"/":native".
  std::vector<std::string> build_depends;
  uint64_t bytes = 0;  // the download: the sizes in its Files list (.dsc, tarballs)
};

// Parses a Sources index (deb822 paragraphs). When a name appears more than once, the highest version is kept (what
// `apt-get source NAME` fetches). Sorted by name.
std::vector<SourcePackage> parse_sources_index(std::istream& in);

// dpkg's version order (epoch, upstream, revision; '~' before anything, letters before other characters):
// negative, zero or positive like strcmp. Matches `dpkg --compare-versions`.
int compare_debian_versions(std::string_view a, std::string_view b);

// Which source packages a corpus takes (recipes/data/debian.json, "select").
struct SelectionRules {
  // Name patterns ('*' any run, '?' one character). Taken when any build dependency matches build_depends_any.
  std::vector<std::string> build_depends_any;
  std::vector<std::string> include;  // always taken, size limit aside
  std::vector<std::string> exclude;  // never taken
  uint64_t max_bytes = 0;            // 0: no limit on a package's download
  // After unpacking: a package with fewer C++ files than this is dropped (kept in the list as rejected, so a resumed
  // fetch does not download it again).
  int min_cpp_files = 0;
  static SelectionRules from_json(const nlohmann::json& j, const std::string& where);
};

// Empty when the package is taken, else why not ("no build dependency matches", "excluded", "larger than ...").
std::string selection_verdict(const SourcePackage& p, const SelectionRules& rules);

// The package list: one "NAME VERSION BYTES" line per package ('#' comments and blank lines ignored).
struct ListedPackage {
  std::string name, version;
  uint64_t bytes = 0;
};
std::vector<ListedPackage> read_package_list(const std::string& path);  // throws slm::Error with file:line
std::string format_package_list(const std::vector<ListedPackage>& packages, const std::string& header_comment);

}  // namespace slm::data
