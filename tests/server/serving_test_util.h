#pragma once
// What the server tests and the chat/generate command-line tests share: the toy router (two labels, cmake and shell,
// each learnt from one unmistakable word list) and the independent expectations of a chat turn through the
// 512-id code tokenizer.
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "slm/data/detokenizer.h"
#include "slm/router/classifier.h"
#include "slm/router/train.h"

namespace slm::test {

inline router::Classifier toy_router() {
  std::vector<router::LabelledText> train;
  for (int i = 0; i < 30; ++i) {
    train.push_back(
        {"add_library target_link_libraries find_package cmake_minimum_required " + std::to_string(i), "cmake"});
    train.push_back({"grep sed awk xargs while read line; do echo $line; done " + std::to_string(i), "shell"});
  }
  router::TrainOptions o;
  o.features.bucket_bits = 12;
  o.epochs = 5;
  return router::train_router(train, {}, o);
}

// The ids the chat template must produce for one user message (docs/serving.md; ids from tokenizer/README.md).
inline std::vector<int64_t> user_prompt(const std::string& text) {
  std::vector<int64_t> ids = {2, 5};
  for (uint32_t id : code512().encode(text)) ids.push_back(id);
  ids.push_back(9);
  ids.push_back(6);
  return ids;
}

// What a chat answer may sample: every id but the control tokens other than <|eos|> 3 and <|end|> 9.
inline std::vector<int64_t> chat_banned() {
  std::vector<int64_t> out;
  for (uint32_t id = 0; id < 512; ++id)
    if (code512().is_special(id) && id != 3 && id != 9) out.push_back(id);
  return out;
}

// The text the server sends for these ids: their bytes, with ill-formed UTF-8 (a random model emits byte-fallback ids
// freely) replaced by U+FFFD, as JSON requires (replace_invalid_utf8 has its own hand-written cases).
inline std::string text_of(const std::vector<int64_t>& ids) {
  return data::replace_invalid_utf8(code512().decode(std::vector<uint32_t>(ids.begin(), ids.end())));
}

}  // namespace slm::test
