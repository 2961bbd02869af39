#pragma once
// Text in, text out over the engine's ids: how a prompt becomes a model's ids (BOS, the ids never sampled), how
// generated ids become text (whole UTF-8 characters) and when a stop string ends it. Text lives in this room
// (chat template, stop strings, infill prompts); engine/ sees only ids.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "slm/data/detokenizer.h"
#include "slm/data/tokenizer.h"
#include "slm/engine/generation.h"
#include "slm/model/hybrid_lm.h"

namespace slm::text {

// How text generation reads a model's ids, with the code tokenizer or (tokenizer null) the byte-level one
// (data::ByteTokenizer). The prompt becomes BOS + its ids. Never sampled: with the code tokenizer the specials other
// than EOS and ids past the tokenizer; byte-level, everything but the 256 bytes and EOS. EOS ends generation. Throws
// slm::Error when the tokenizer's ids do not fit the model's vocabulary of `vocab`.
struct TextIds {
  std::vector<int64_t> prompt, banned;
  int64_t eos = 0;
};
TextIds text_ids(const data::Tokenizer* tokenizer, int64_t vocab, const std::string& prompt);

// Generated ids back into text, for generate_text, generate_byte_text and callers that run an Engine themselves:
// whole UTF-8 characters (code tokenizer: byte-fallback ids can split one) or bytes; other ids add nothing. stopped()
// turns true once the text holds one of the stop strings (the id that completes it included: the caller cuts).
class TextOutput {
 public:
  // tokenizer: as text_ids; it must outlive this.
  TextOutput(const data::Tokenizer* tokenizer, std::vector<std::string> stops);
  // The text that is complete after id ("" while a character is unfinished).
  std::string push(int64_t id);
  // What an unfinished character left at the end of the stream.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::optional<data::Detokenizer> detok_;
  std::vector<std::string> stops_;
  std::string text_;
  bool stopped_ = false;
};

// Text in, text out with the code tokenizer (text_ids, TextOutput): on_text receives the text as it completes.
// options.banned and stop_id are set here.
std::vector<int64_t> generate_text(model::HybridLM& model, const data::Tokenizer& tokenizer, const std::string& prompt,
                                   engine::GenerationOptions options,
                                   const std::function<void(const std::string&)>& on_text,
                                   engine::GenerationStats* stats = nullptr);

// The same with the byte-level tokenizer; EOS ends generation only when stop_at_eos. on_id sees each new id.
std::vector<int64_t> generate_byte_text(model::HybridLM& model, const std::string& prompt,
                                        engine::GenerationOptions options, bool stop_at_eos,
                                        const std::function<void(int64_t)>& on_id,
                                        engine::GenerationStats* stats = nullptr);

}  // namespace slm::text
