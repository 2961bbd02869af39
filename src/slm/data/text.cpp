#include "slm/data/text.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "slm/util/error.h"

namespace slm::data {

std::string_view trim_space(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string ascii_lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string file_head(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

namespace fs = std::filesystem;

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0)
      len = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0)
      len = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0)
      len = 4, cp = c & 0x07;
    else
      return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

bool is_clean_text(std::string_view text) {
  return text.find('\0') == std::string_view::npos && is_valid_utf8(text);
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

namespace {

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_jsonl(const fs::path& p) {
  return p.extension() == ".jsonl";
}

}  // namespace

uint64_t text_input_bytes(const std::vector<std::string>& inputs) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& in : inputs) {
    if (fs::is_directory(in, ec)) {
      for (const auto& f : files_under(in)) total += fs::file_size(f, ec);
    } else if (fs::exists(in, ec)) {
      total += fs::file_size(in, ec);
    }
  }
  return total;
}

void for_each_text_document(const std::vector<std::string>& inputs, const std::function<void(const TextDocument&)>& fn,
                            uint64_t max_file_bytes) {
  std::error_code ec;
  for (const auto& in : inputs) {
    std::vector<fs::path> files;
    if (fs::is_directory(in, ec))
      files = files_under(in);
    else if (fs::exists(in, ec))
      files.push_back(in);
    else
      throw Error(in + ": no such input file or directory");
    for (const auto& f : files) {
      if (is_jsonl(f)) {
        std::ifstream jin(f, std::ios::binary);
        std::string line;
        uint64_t lineno = 0;
        while (std::getline(jin, line)) {
          ++lineno;
          if (line.empty()) continue;
          TextDocument d;
          try {
            auto j = nlohmann::json::parse(line);
            d.text = j.at("text").get<std::string>();
            d.meta = DocumentMeta::from_json(j);
          } catch (const nlohmann::json::exception& e) {
            throw Error(f.string() + ":" + std::to_string(lineno) + ": not a corpus record: " + e.what());
          }
          d.id = f.string() + ":" + std::to_string(lineno);
          d.raw_bytes = line.size() + 1;
          fn(d);
        }
      } else {
        const uint64_t size = fs::file_size(f, ec);
        if (ec || size > max_file_bytes) continue;
        TextDocument d;
        d.id = f.string();
        d.text = read_file_bytes(f.string());
        d.raw_bytes = d.text.size();
        d.meta.path = f.string();
        fn(d);
      }
    }
  }
}

std::string corpus_record(const std::string& text, const DocumentMeta& meta) {
  auto j = meta.to_json();
  j["text"] = text;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace slm::data
