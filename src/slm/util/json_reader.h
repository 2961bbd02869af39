#pragma once
// Strict reading of JSON objects: typed fields, clear errors naming the file and dotted path, and
// rejection of keys nobody read (a typo must not be silently ignored).
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "slm/util/error.h"

namespace slm {

// Parses text as JSON; a syntax error becomes an Error naming source, line and column.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);
// Reads a whole file and parses it; a missing/unreadable file is an Error naming it.
nlohmann::json parse_json_file(const std::string& path);
std::string read_text_file(const std::string& path);

class JsonObjectReader {
 public:
  // path: dotted location of this object ("" for the root), source: file name for messages.
  JsonObjectReader(const nlohmann::json& object, std::string path, std::string source);

  bool has(const std::string& key) const;
  long long get_int(const std::string& key) const;
  long long get_int(const std::string& key, long long fallback) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  // The raw value (marked as read); throws if absent.
  const nlohmann::json& get(const std::string& key) const;
  // A nested object reader; throws if the value is not an object.
  JsonObjectReader object(const std::string& key) const;

  // Throws on the first key that no getter asked for, suggesting the closest known key.
  void reject_unknown_keys(const std::vector<std::string>& known_extra = {}) const;

  std::string field(const std::string& key) const;  // "file: a.b.key" for messages
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json& lookup(const std::string& key) const;
  const nlohmann::json& object_;
  std::string path_;
  std::string source_;
  mutable std::set<std::string> used_;   // present and read
  mutable std::set<std::string> asked_;  // every key a getter asked for, present or not
};

}  // namespace slm
