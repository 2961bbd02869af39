#include "slm/data/engram_canonical.h"

#include <string>
#include <unordered_map>

#include "slm/data/text.h"
#include "slm/util/error.h"

namespace slm::data {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

}  // namespace

std::string engram_normal_form(std::string_view text) {
  static const std::string kSpaceMarker = "\xE2\x96\x81";  // U+2581, sentencepiece's space
  std::string out;
  bool pending_space = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (text.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) {
      c = ' ';
      i += kSpaceMarker.size() - 1;
    }
    if (is_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  }
  return out.empty() ? std::string(text) : out;
}

std::vector<int64_t> engram_canonical_map(const std::vector<std::string>& texts, const std::vector<bool>& special) {
  if (special.size() != texts.size()) throw Error("engram canonical map: one special flag per token text needed");
  std::unordered_map<std::string, int64_t> index;
  std::vector<int64_t> out;
  out.reserve(texts.size());
  for (size_t id = 0; id < texts.size(); ++id) {
    // Keys of their own start with a byte no normal form starts with (normal forms are valid UTF-8 text).
    std::string key = special[id] ? "\xFF"
                                    "special " +
                                        std::to_string(id)
                      : !is_valid_utf8(texts[id]) ? "\xFF"
                                                          "bytes " +
                                                              texts[id]
                                                        : engram_normal_form(texts[id]);
    auto [it, added] = index.emplace(key, static_cast<int64_t>(index.size()));
    out.push_back(it->second);
  }
  return out;
}

std::vector<int64_t> engram_canonical_map(const data::Tokenizer& tok) {
  std::vector<std::string> texts;
  std::vector<bool> special;
  for (uint32_t id = 0; id < tok.vocab_size(); ++id) {
    texts.push_back(tok.decode({id}));
    special.push_back(tok.is_special(id));
  }
  return engram_canonical_map(texts, special);
}

}  // namespace slm::data
