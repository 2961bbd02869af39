#pragma once
// Streaming decode: token ids in one at a time, text out in whole UTF-8 characters. A byte-fallback id carries one
// byte of a multi-byte character, so the bytes of an unfinished character are held until it completes (or until
// flush(), at the end of the stream, which returns whatever is left as is).
#include <cstdint>
#include <string>
#include <string_view>

#include "slm/data/tokenizer.h"

namespace slm::data {

// `text` with every ill-formed UTF-8 subsequence replaced by U+FFFD: a byte that cannot start a character, or a
// start and the continuation bytes that follow it when the character is cut short (Unicode's "maximal subpart"
// practice: one U+FFFD each; overlong forms, surrogates and code points past U+10FFFF are ill-formed). A random or
// young model can emit such bytes through byte-fallback ids; JSON cannot carry them.
std::string replace_invalid_utf8(std::string_view text);

// Bytes at the end of `text` that start a UTF-8 character whose continuation bytes have not arrived yet (0-3).
size_t incomplete_utf8_tail(const std::string& text);

class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // The text that is complete after this id (may be empty). Specials decode to nothing.
  std::string push(uint32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace slm::data
