#pragma once
// Byte-level tokenizer: ids 0..255 are the bytes, then the special ids. Serves until the trained tokenizer
// of the data pipeline lands; any model with vocab_size >= kVocabSize can use it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace slm::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kBos = 256;
  static constexpr int64_t kEos = 257;
  static constexpr int64_t kPad = 258;
  static constexpr int64_t kVocabSize = 259;

  std::vector<int64_t> encode(std::string_view text, bool add_bos) const;
  // Bytes of the byte ids; special ids are left out. Throws slm::Error for ids outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids) const;
  // Printable form of one id: the byte itself when printable ASCII or whitespace, "\xNN" for other bytes,
  // "<bos>" / "<eos>" / "<pad>" for specials.
  std::string display(int64_t id) const;
  static bool is_special(int64_t id) { return id >= kBos && id < kVocabSize; }
};

}  // namespace slm::data
