#include "slm/data/detokenizer.h"

namespace slm::data {

std::string replace_invalid_utf8(std::string_view t) {
  std::string out;
  out.reserve(t.size());
  size_t i = 0;
  while (i < t.size()) {
    const auto c = static_cast<unsigned char>(t[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Length and the range of the second byte by lead byte (Unicode Table 3-7, well-formed UTF-8).
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c == 0xE0)
      len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
      len = 3;
    else if (c == 0xED)
      len = 3, hi = 0x9F;
    else if (c == 0xF0)
      len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      len = 4;
    else if (c == 0xF4)
      len = 4, hi = 0x8F;
    size_t j = i + 1;
    if (len > 0)
      for (; j < i + len && j < t.size(); ++j) {
        const auto b = static_cast<unsigned char>(t[j]);
        if (b < (j == i + 1 ? lo : 0x80) || b > (j == i + 1 ? hi : 0xBF)) break;
      }
    if (len > 0 && j == i + len) {
      out.append(t.substr(i, len));
    } else {
      out += "\xEF\xBF\xBD";
      if (len == 0) j = i + 1;
    }
    i = j;
  }
  return out;
}

size_t incomplete_utf8_tail(const std::string& text) {
  // Walk back over at most 3 continuation bytes to the lead byte and compare the length it announces.
  const size_t n = text.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;  // only continuation bytes: invalid UTF-8, nothing to wait for
}

std::string Detokenizer::push(uint32_t id) {
  pending_ += tokenizer_.decode({id});
  const size_t hold = incomplete_utf8_tail(pending_);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string Detokenizer::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace slm::data
