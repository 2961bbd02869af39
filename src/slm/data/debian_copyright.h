#pragma once
// Licenses of the files of a Debian source package, from its debian/copyright, and the policy that decides which
// of them may enter a training corpus.
//
// debian/copyright is machine-readable (DEP-5, https://dep-team.pages.debian.net/deps/dep5/) in most packages:
// "Files:" paragraphs map glob patterns to a "License:" short name, and the last paragraph whose pattern matches a
// file gives its license. Older files are free text; for those one license is guessed for the whole package from
// well-known license texts.
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace slm::data {

class DebianCopyright {
 public:
  // Parses the text of a debian/copyright file (never throws: a file that is not DEP-5 falls back to the guess).
  static DebianCopyright parse(std::string_view text);
  // Reads <path>; a missing file gives an empty copyright whose every license is "".
  static DebianCopyright read(const std::string& path);

  bool machine_readable() const { return machine_readable_; }
  // The license short name of a file, by its path relative to the package root ("src/a.cpp"): the last matching
  // "Files:" paragraph; else the header paragraph's License; else the free-text guess; else "".
  std::string license_of(std::string_view relative_path) const;
  // The package's main license: that of "Files: *" when present, else the first named license, else the guess.
  std::string main_license() const;

 private:
  struct Stanza {
    std::vector<std::string> patterns;
    std::string license;
  };
  bool machine_readable_ = false;
  std::vector<Stanza> stanzas_;
  std::string header_license_, first_license_, guess_;
};

// DEP-5 "Files:" pattern matching: '*' matches any run of characters including '/', '?' one character, and a
// backslash escapes '*', '?' or '\'. Patterns are relative to the package root; a leading "./" is ignored, and a
// pattern ending in '/' (a common mistake for "dir/*") matches everything below that directory.
bool dep5_match(std::string_view pattern, std::string_view path);

// Which license expressions may enter a corpus. An expression combines short names with "or" (any one allowed is
// enough), "and"/"," (every one must be allowed) and "with <exception>" (ignored: exceptions only add permissions).
// Names compare by normalize_license_name; an allowed entry ending in '*' is a prefix ("bsd-*"). An empty
// expression is never allowed.
class LicensePolicy {
 public:
  LicensePolicy() = default;
  explicit LicensePolicy(std::vector<std::string> allowed);
  // {"allowed": ["expat", "bsd-*", ...]}; throws slm::Error naming `where` when the field is missing or not strings.
  static LicensePolicy from_json(const nlohmann::json& j, const std::string& where);
  bool allows(std::string_view expression) const;
  const std::vector<std::string>& allowed() const { return allowed_; }

 private:
  bool allows_name(std::string name) const;
  std::vector<std::string> allowed_;
};

// Lower case without a trailing "+", "-only", "-or-later" or ".0", trimmed: "GPL-2.0+" and "GPL-2" -> "gpl-2";
// "LGPL-2.1-or-later" -> "lgpl-2.1"; "Apache-2.0" -> "apache-2".
std::string normalize_license_name(std::string_view name);

}  // namespace slm::data
