#include "slm/router/features.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "slm/data/hashing.h"
#include "slm/util/error.h"

namespace slm::router {

namespace {

constexpr uint64_t kWordSeed = 0x776f7264ULL, kBigramSeed = 0x62696772ULL, kCharSeed = 0x63686172ULL,
                   kTrigramSeed = 0x74726967ULL, kLineStartSeed = 0x6c737461ULL, kLineWordSeed = 0x6c776f72ULL,
                   kLineEndSeed = 0x6c656e64ULL;

bool is_word_byte(unsigned char c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

std::vector<std::string_view> words(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (std::isspace(c)) {
      ++i;
    } else if (is_word_byte(c)) {
      size_t j = i;
      while (j < text.size() && is_word_byte(static_cast<unsigned char>(text[j]))) ++j;
      out.push_back(text.substr(i, j - i));
      i = j;
    } else {
      out.push_back(text.substr(i, 1));
      ++i;
    }
  }
  return out;
}

}  // namespace

void validate(const FeatureOptions& o) {
  if (o.bucket_bits < 4 || o.bucket_bits > 26) throw Error("router features: bucket_bits must be in [4, 26]");
  if (o.char_max > 16 || (o.char_max > 0 && (o.char_min < 1 || o.char_min > o.char_max)))
    throw Error("router features: need 1 <= char_min <= char_max <= 16 (or char_max 0 for none)");
  if (o.max_bytes < 1) throw Error("router features: max_bytes must be at least 1");
}

SparseVector extract_features(std::string_view text, const FeatureOptions& o) {
  text = text.substr(0, std::min<size_t>(text.size(), o.max_bytes));
  const uint32_t mask = o.buckets() - 1;
  std::vector<uint32_t> hits;
  const auto ws = words(text);
  hits.reserve(ws.size() * 2 + text.size() * (o.char_max >= o.char_min ? o.char_max - o.char_min + 1 : 0));
  for (size_t i = 0; i < ws.size(); ++i) {
    hits.push_back(static_cast<uint32_t>(data::hash64(ws[i], kWordSeed)) & mask);
    if (o.word_bigrams && i + 1 < ws.size()) {
      // The pair's hash mixes both words' hashes; no string is built.
      const uint64_t h = data::mix64(data::hash64(ws[i], kBigramSeed) ^ (data::hash64(ws[i + 1], kBigramSeed) << 1));
      hits.push_back(static_cast<uint32_t>(h) & mask);
    }
  }
  if (o.word_trigrams)
    for (size_t i = 0; i + 2 < ws.size(); ++i) {
      const uint64_t h = data::mix64(data::hash64(ws[i], kTrigramSeed) ^ (data::hash64(ws[i + 1], kTrigramSeed) << 1) ^
                                     (data::hash64(ws[i + 2], kTrigramSeed) << 2));
      hits.push_back(static_cast<uint32_t>(h) & mask);
    }
  if (o.line_shapes)
    for (size_t start = 0; start < text.size();) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(start, end - start);
      start = end + 1;
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
      if (line.empty()) continue;
      hits.push_back(static_cast<uint32_t>(data::hash64(line.substr(0, 2), kLineStartSeed)) & mask);
      hits.push_back(static_cast<uint32_t>(
                         data::hash64(line.substr(line.size() - std::min<size_t>(2, line.size())), kLineEndSeed)) &
                     mask);
      const size_t first = line.find_first_not_of(" \t");
      const auto w = words(line.substr(first));
      if (!w.empty()) hits.push_back(static_cast<uint32_t>(data::hash64(w[0], kLineWordSeed)) & mask);
    }
  if (o.char_max > 0)
    for (uint32_t n = o.char_min; n <= o.char_max; ++n)
      for (size_t i = 0; i + n <= text.size(); ++i)
        hits.push_back(static_cast<uint32_t>(data::hash64(text.substr(i, n), kCharSeed + n)) & mask);
  std::sort(hits.begin(), hits.end());
  SparseVector v;
  double norm2 = 0;
  for (size_t i = 0; i < hits.size();) {
    size_t j = i;
    while (j < hits.size() && hits[j] == hits[i]) ++j;
    const double x = std::log1p(static_cast<double>(j - i));
    v.index.push_back(hits[i]);
    v.value.push_back(static_cast<float>(x));
    norm2 += x * x;
    i = j;
  }
  if (norm2 > 0) {
    const auto inv = static_cast<float>(1.0 / std::sqrt(norm2));
    for (auto& x : v.value) x *= inv;
  }
  return v;
}

}  // namespace slm::router
