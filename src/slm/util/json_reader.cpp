#include "slm/util/json_reader.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "slm/util/edit_distance.h"

namespace slm {

namespace {

std::string describe(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  // read(), not `ss << in.rdbuf()`: a failing read (a directory opens, then reading it fails with EISDIR) sets
  // in's badbit through read(), where operator<< swallowed it and returned "" as if the file were empty.
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) text.append(buf, static_cast<size_t>(in.gcount()));
  if (in.bad()) throw Error(path + ": read error");
  return text;
}

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the 1-based offset of the offending byte; turn it into line:column.
    size_t offset = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    size_t line = 1, col = 1;
    for (size_t i = 0; i < offset; ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    std::string what = e.what();
    // nlohmann's message starts with "[json.exception.parse_error.101] parse error at line L, column C: ..."
    auto colon = what.find(": ", what.find("parse error"));
    std::string detail = colon == std::string::npos ? what : what.substr(colon + 2);
    throw Error(source + ":" + std::to_string(line) + ":" + std::to_string(col) + ": malformed JSON: " + detail);
  } catch (const nlohmann::json::out_of_range& e) {  // a number past double's range (1e400): no position given
    std::string what = e.what();
    throw Error(source + ": malformed JSON: " + what.substr(what.find(']') + 2));
  }
}

nlohmann::json parse_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

JsonObjectReader::JsonObjectReader(const nlohmann::json& object, std::string path, std::string source)
    : object_(object), path_(std::move(path)), source_(std::move(source)) {
  if (!object_.is_object()) {
    throw Error(source_ + ": " + (path_.empty() ? std::string("top level") : path_) + ": expected a JSON object, got " +
                describe(object_));
  }
}

std::string JsonObjectReader::field(const std::string& key) const {
  return source_ + ": " + (path_.empty() ? key : path_ + "." + key);
}

void JsonObjectReader::fail(const std::string& key, const std::string& message) const {
  throw Error(field(key) + ": " + message);
}

bool JsonObjectReader::has(const std::string& key) const {
  asked_.insert(key);
  bool present = object_.contains(key);
  if (present) used_.insert(key);
  return present;
}

const nlohmann::json& JsonObjectReader::lookup(const std::string& key) const {
  auto it = object_.find(key);
  asked_.insert(key);
  if (it == object_.end()) fail(key, "required field is missing");
  used_.insert(key);
  return *it;
}

const nlohmann::json& JsonObjectReader::get(const std::string& key) const { return lookup(key); }

long long JsonObjectReader::get_int(const std::string& key) const {
  const auto& v = lookup(key);
  if (!v.is_number_integer()) fail(key, "expected an integer, got " + describe(v));
  return v.get<long long>();
}

long long JsonObjectReader::get_int(const std::string& key, long long fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double JsonObjectReader::get_double(const std::string& key) const {
  const auto& v = lookup(key);
  if (!v.is_number()) fail(key, "expected a number, got " + describe(v));
  return v.get<double>();
}

double JsonObjectReader::get_double(const std::string& key, double fallback) const {
  return has(key) ? get_double(key) : fallback;
}

bool JsonObjectReader::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = lookup(key);
  if (!v.is_boolean()) fail(key, "expected true or false, got " + describe(v));
  return v.get<bool>();
}

std::string JsonObjectReader::get_string(const std::string& key) const {
  const auto& v = lookup(key);
  if (!v.is_string()) fail(key, "expected a string, got " + describe(v));
  return v.get<std::string>();
}

std::string JsonObjectReader::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

JsonObjectReader JsonObjectReader::object(const std::string& key) const {
  const auto& v = lookup(key);
  if (!v.is_object()) fail(key, "expected a JSON object, got " + describe(v));
  return JsonObjectReader(v, path_.empty() ? key : path_ + "." + key, source_);
}

void JsonObjectReader::reject_unknown_keys(const std::vector<std::string>& known_extra) const {
  for (const auto& [key, value] : object_.items()) {
    if (used_.count(key) || std::find(known_extra.begin(), known_extra.end(), key) != known_extra.end()) continue;
    std::string best;
    size_t best_d = 3;  // suggest only close matches
    for (const auto& k : asked_) {
      size_t d = edit_distance(key, k);
      if (d < best_d) best_d = d, best = k;
    }
    (void)value;
    std::string hint = best.empty() ? "" : " (did you mean '" + best + "'?)";
    fail(key, "unknown key" + hint);
  }
}

}  // namespace slm
