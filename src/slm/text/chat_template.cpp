#include "slm/text/chat_template.h"

#include "slm/util/error.h"

namespace slm::text {

ChatTemplate::ChatTemplate(const data::Tokenizer& t) : tokenizer_(t) {
  try {
    bos_ = t.bos_id();
    eos_ = t.eos_id();
    end_ = t.special_id("<|end|>");
    system_ = t.special_id("<|system|>");
    user_ = t.special_id("<|user|>");
    assistant_ = t.special_id("<|assistant|>");
    tool_result_ = t.special_id("<|tool_result|>");
  } catch (const Error& e) {
    throw Error("chat template: tokenizer " + t.name() + " lacks the chat control tokens (" + e.what() + ")");
  }
}

std::vector<int64_t> ChatTemplate::chat_prompt(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) throw Error("messages must hold at least one message");
  std::vector<int64_t> ids = {bos_};
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    int64_t marker;
    if (m.role == "system" || m.role == "developer")
      marker = system_;
    else if (m.role == "user")
      marker = user_;
    else if (m.role == "assistant")
      marker = assistant_;
    else if (m.role == "tool")
      marker = tool_result_;
    else
      throw Error("messages[" + std::to_string(i) + "].role: unknown role \"" + m.role +
                  "\" (system, developer, user, assistant, tool)");
    ids.push_back(marker);
    for (uint32_t id : tokenizer_.encode(m.content)) ids.push_back(id);
    ids.push_back(end_);
  }
  ids.push_back(assistant_);
  return ids;
}

std::vector<int64_t> ChatTemplate::completion_prompt(const std::string& text) const {
  std::vector<int64_t> ids = {bos_};
  for (uint32_t id : tokenizer_.encode(text)) ids.push_back(id);
  return ids;
}

std::vector<int64_t> ChatTemplate::banned_ids(int64_t vocab) const {
  std::vector<int64_t> out;
  for (int64_t id = 0; id < vocab; ++id)
    if (id >= static_cast<int64_t>(tokenizer_.vocab_size()) ||
        (tokenizer_.is_special(static_cast<uint32_t>(id)) && id != end_ && id != eos_))
      out.push_back(id);
  return out;
}

}  // namespace slm::text
