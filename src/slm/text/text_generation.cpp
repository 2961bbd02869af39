#include "slm/text/text_generation.h"

#include <torch/torch.h>

#include <algorithm>

#include "slm/data/byte_tokenizer.h"
#include "slm/util/error.h"

namespace slm::text {

namespace {

// Whether text, which grew by `added` bytes since the last call, now holds a stop text (only the part a new
// occurrence can overlap is searched).
bool reached_stop(const std::string& text, size_t added, const std::vector<std::string>& stops) {
  for (const auto& s : stops) {
    if (s.empty()) continue;
    const size_t from = text.size() - std::min(text.size(), added + s.size() - 1);
    if (text.find(s, from) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TextIds text_ids(const data::Tokenizer* tok, int64_t vocab, const std::string& prompt) {
  TextIds t;
  if (!tok) {
    if (vocab < data::ByteTokenizer::kVocabSize)
      throw Error("generate: vocab_size " + std::to_string(vocab) + " is smaller than the byte tokenizer's " +
                  std::to_string(data::ByteTokenizer::kVocabSize) + " ids");
    const auto ids = data::ByteTokenizer().encode(prompt, /*add_bos=*/true);
    t.prompt.assign(ids.begin(), ids.end());
    t.eos = data::ByteTokenizer::kEos;
    for (int64_t id = 256; id < vocab; ++id)
      if (id != t.eos) t.banned.push_back(id);
    return t;
  }
  if (static_cast<int64_t>(tok->vocab_size()) > vocab)
    throw Error("generate: the tokenizer's " + std::to_string(tok->vocab_size()) +
                " ids do not fit the recipe's vocabulary of " + std::to_string(vocab));
  t.prompt = {static_cast<int64_t>(tok->bos_id())};
  for (uint32_t id : tok->encode(prompt)) t.prompt.push_back(id);
  t.eos = tok->eos_id();
  for (int64_t id = 0; id < vocab; ++id)
    if (id >= static_cast<int64_t>(tok->vocab_size()) || (tok->is_special(static_cast<uint32_t>(id)) && id != t.eos))
      t.banned.push_back(id);
  return t;
}

TextOutput::TextOutput(const data::Tokenizer* tokenizer, std::vector<std::string> stops) : stops_(std::move(stops)) {
  if (tokenizer) detok_.emplace(*tokenizer);
}

std::string TextOutput::push(int64_t id) {
  std::string piece = detok_ ? detok_->push(static_cast<uint32_t>(id))
                             : (id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string());
  text_ += piece;
  stopped_ = stopped_ || reached_stop(text_, piece.size(), stops_);
  return piece;
}

std::string TextOutput::flush() {
  return detok_ ? detok_->flush() : "";
}

namespace {

// generate() over text: the options' banned ids and stop id from text_ids, ending once `out` has stopped.
std::vector<int64_t> generate_over_text(model::HybridLM& model, const TextIds& t, engine::GenerationOptions o,
                                        int64_t stop_id, TextOutput& out,
                                        const std::function<void(int64_t, const std::string&)>& seen,
                                        engine::GenerationStats* stats) {
  o.banned = torch::zeros({model.recipe().vocab_size}, torch::kBool).index_fill_(0, torch::tensor(t.banned), true);
  o.stop_id = stop_id;
  return engine::generate(
      model, t.prompt, o,
      [&](int64_t id) {
        seen(id, out.push(id));
        return !out.stopped();
      },
      stats);
}

}  // namespace

std::vector<int64_t> generate_text(model::HybridLM& model, const data::Tokenizer& tok, const std::string& prompt,
                                   engine::GenerationOptions o, const std::function<void(const std::string&)>& on_text,
                                   engine::GenerationStats* stats) {
  const TextIds t = text_ids(&tok, model.recipe().vocab_size, prompt);
  TextOutput out(&tok, o.stop_texts);
  auto ids = generate_over_text(
      model, t, o, t.eos, out,
      [&](int64_t, const std::string& piece) {
        if (on_text && !piece.empty()) on_text(piece);
      },
      stats);
  if (std::string rest = out.flush(); on_text && !rest.empty()) on_text(rest);
  return ids;
}

std::vector<int64_t> generate_byte_text(model::HybridLM& model, const std::string& prompt, engine::GenerationOptions o,
                                        bool stop_at_eos, const std::function<void(int64_t)>& on_id,
                                        engine::GenerationStats* stats) {
  const TextIds t = text_ids(nullptr, model.recipe().vocab_size, prompt);
  TextOutput out(nullptr, o.stop_texts);
  return generate_over_text(
      model, t, o, stop_at_eos ? t.eos : -1, out,
      [&](int64_t id, const std::string&) {
        if (on_id) on_id(id);
      },
      stats);
}

}  // namespace slm::text
