#include "slm/data/byte_tokenizer.h"

#include <cstdio>

#include "slm/util/error.h"

namespace slm::data {

namespace {
void check_id(int64_t id) {
  if (id < 0 || id >= ByteTokenizer::kVocabSize)
    throw Error("byte tokenizer: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(ByteTokenizer::kVocabSize) + ")");
}
}  // namespace

std::vector<int64_t> ByteTokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() + 1);
  if (add_bos) ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    check_id(id);
    if (id < 256) out.push_back(static_cast<char>(id));
  }
  return out;
}

std::string ByteTokenizer::display(int64_t id) const {
  check_id(id);
  switch (id) {
    case kBos: return "<bos>";
    case kEos: return "<eos>";
    case kPad: return "<pad>";
  }
  if ((id >= 0x20 && id < 0x7f) || id == '\n' || id == '\t') return std::string(1, static_cast<char>(id));
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(id));
  return buf;
}

}  // namespace slm::data
