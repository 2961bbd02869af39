#pragma once
// How requests become token ids for the code tokenizer (tokenizer/README.md lists its control tokens):
//
//   chat:        <|bos|> (<|system|> text <|end|>)? (<|user|> text <|end|> | <|assistant|> text <|end|>)* <|assistant|>
//   completion:  <|bos|> text
//
// Role markers are control ids, which no text ever encodes to (a literal "<|user|>" in a message is ordinary
// pieces), so a message cannot forge a turn. Generation stops at <|end|> (the assistant closed its turn) or
// <|eos|>; no other control token is ever sampled. A "tool" message is wrapped as <|tool_result|> text <|end|>.
// docs/serving.md documents the template.
#include <cstdint>
#include <string>
#include <vector>

#include "slm/data/tokenizer.h"

namespace slm::text {

struct ChatMessage {
  std::string role;  // system (or developer), user, assistant, tool
  std::string content;
};

class ChatTemplate {
 public:
  // Throws slm::Error when the tokenizer lacks the chat control tokens.
  explicit ChatTemplate(const data::Tokenizer& tokenizer);
  // Throws slm::Error for an empty conversation or an unknown role (naming the message's index).
  std::vector<int64_t> chat_prompt(const std::vector<ChatMessage>& messages) const;
  std::vector<int64_t> completion_prompt(const std::string& text) const;
  // The ids that end a generation: <|end|>, <|eos|>.
  std::vector<int64_t> stop_ids() const { return {end_, eos_}; }
  // Ids never sampled by a model of `vocab` ids: every control token but <|end|> and <|eos|>, and ids past the
  // tokenizer's vocabulary.
  std::vector<int64_t> banned_ids(int64_t vocab) const;

 private:
  const data::Tokenizer& tokenizer_;
  int64_t bos_, eos_, end_, system_, user_, assistant_, tool_result_;
};

}  // namespace slm::text
