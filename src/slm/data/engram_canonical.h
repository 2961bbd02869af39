#pragma once
// Engram's token compression map (its canonical ids, DeepSeek's Engram step 1), built from a tokenizer's vocabulary on
// the data side and handed to the model as ids (model::HybridLM::set_engram_canonical_ids), so the model never sees a
// tokenizer.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slm/data/tokenizer.h"

namespace slm::data {

// The key equal token texts share: ASCII lowercase, the sentencepiece space marker U+2581 read as a space,
// whitespace runs collapsed to one space and stripped at both ends; a text that normalises to "" keeps itself.
std::string engram_normal_form(std::string_view text);

// The compression map of a vocabulary: map[id] = dense index (in first-seen order) of the id's key. The key is
// engram_normal_form of its text, except that texts which are not valid UTF-8 (partial byte tokens) and special
// tokens keep a key of their own.
std::vector<int64_t> engram_canonical_map(const std::vector<std::string>& texts, const std::vector<bool>& special);
std::vector<int64_t> engram_canonical_map(const Tokenizer& tokenizer);

}  // namespace slm::data
