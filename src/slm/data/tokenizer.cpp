#include "slm/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "slm/data/bpe_encoder.h"
#include "slm/data/hashing.h"
#include "slm/data/text.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::data {

const std::vector<std::string>& tokenizer_control_symbols() {
  static const std::vector<std::string> symbols = [] {
    std::vector<std::string> s = {
        // chat format: <|system|> ... <|end|> <|user|> ... <|end|> <|assistant|> ... <|end|>; tool calls/results
        "<|system|>", "<|user|>", "<|assistant|>", "<|tool_call|>", "<|tool_result|>", "<|end|>",
        // fill-in-the-middle (PSM order): <|fim_prefix|> P <|fim_suffix|> S <|fim_middle|> M
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
        // context graphs: <|callers|> ... <|target|> ... <|callees|> ...; <|file|> path headers
        "<|callers|>", "<|target|>", "<|callees|>", "<|file|>",
        // routing label of a request (the router's data)
        "<|domain|>",
        // repository-level layout (data/fim.h, text/infill_prompt.h): <|file_sep|> path\n text per file;
        // <|repo_name|> name\n before them (Qwen2.5-Coder's layout; not used yet). They were <|reserved_0|> and
        // <|reserved_1|>: Tokenizer::from_serialized gives older models these names at the same ids.
        "<|file_sep|>", "<|repo_name|>"};
    for (int i = 2; i < 8; ++i) s.push_back("<|reserved_" + std::to_string(i) + "|>");
    return s;
  }();
  return symbols;
}

namespace {

// Length of the valid UTF-8 sequence at p (1..4), or 0 when the bytes there are not valid UTF-8.
size_t utf8_len(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
  else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
  else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
  else return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return len;
}

const std::string kSpaceMarker = "\xe2\x96\x81";  // U+2581

// Reserved control symbols that later got a use, (old name, new name): a model trained before the rename has the
// old piece at the id the new one has in tokenizer_control_symbols(), so it takes the new name and every shipped
// model and checkpoint keeps its ids (the vocabularies are full; growing them would change every model's shape).
constexpr std::pair<const char*, const char*> kRenamedControls[] = {{"<|reserved_0|>", "<|file_sep|>"},
                                                                    {"<|reserved_1|>", "<|repo_name|>"}};

}  // namespace

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& model_path) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) throw Error(model_path + ": cannot read tokenizer model");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return from_serialized(bytes, model_path);
}

Tokenizer Tokenizer::from_serialized(const std::string& model_bytes, const std::string& name) {
  Tokenizer t;
  t.name_ = name;
  auto st = t.sp_->LoadFromSerializedProto(model_bytes);
  if (!st.ok()) throw Error(name + ": not a sentencepiece model: " + st.ToString());
  const int n = t.sp_->GetPieceSize();
  t.bytes_.resize(n);
  t.special_.assign(n, false);
  std::fill(std::begin(t.byte_id_), std::end(t.byte_id_), UINT32_MAX);
  for (int id = 0; id < n; ++id) {
    const std::string& piece = t.sp_->IdToPiece(id);
    if (t.sp_->IsByte(id)) {
      // "<0xNN>"
      const auto b = static_cast<unsigned>(std::stoul(piece.substr(3, 2), nullptr, 16));
      t.bytes_[id] = std::string(1, static_cast<char>(b));
      t.byte_id_[b] = static_cast<uint32_t>(id);
    } else if (t.sp_->IsControl(id) || t.sp_->IsUnknown(id) || t.sp_->IsUnused(id)) {
      t.special_[id] = true;
      t.special_names_.emplace(static_cast<uint32_t>(id), piece);
    } else {
      std::string out;
      for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, 3, kSpaceMarker) == 0) out += ' ', i += 3;
        else out += piece[i++];
      }
      t.bytes_[id] = std::move(out);
    }
  }
  for (const auto& [old_name, new_name] : kRenamedControls) {
    const int id = t.sp_->PieceToId(old_name);
    // Only a control piece of that exact name, and only when the model has no piece of the new name already.
    if (id < 0 || !t.sp_->IsControl(id) || t.sp_->IdToPiece(id) != old_name) continue;
    const int existing = t.sp_->PieceToId(new_name);
    if (existing >= 0 && t.sp_->IdToPiece(existing) == new_name) continue;
    t.special_names_[static_cast<uint32_t>(id)] = new_name;
  }
  for (const auto& [id, special] : t.special_names_) t.special_by_name_.emplace(special, id);
  for (int b = 0; b < 256; ++b)
    if (t.byte_id_[b] == UINT32_MAX) throw Error(name + ": tokenizer model lacks byte fallback (no <0xNN> pieces)");
  if (t.sp_->bos_id() < 0 || t.sp_->eos_id() < 0 || t.sp_->pad_id() < 0)
    throw Error(name + ": tokenizer model lacks BOS, EOS or PAD");
  t.bos_ = t.sp_->bos_id();
  t.eos_ = t.sp_->eos_id();
  t.pad_ = t.sp_->pad_id();
  t.fast_ = BpeEncoder::create(model_bytes, nullptr);
  return t;
}

// Splits text at the bytes sentencepiece would alter (NUL, invalid UTF-8, U+2581), which go straight to byte ids;
// encode_segment(segment, out) appends the ids of each piece of text between them.
template <class EncodeSegment>
std::vector<uint32_t> Tokenizer::encode_with(std::string_view text, EncodeSegment encode_segment) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t seg = 0, i = 0;
  auto flush = [&](size_t end) {
    if (end > seg) encode_segment(text.substr(seg, end - seg), out);
  };
  while (i < n) {
    size_t len = p[i] == 0 ? 0 : utf8_len(p + i, n - i);
    if (len == 3 && text.compare(i, 3, kSpaceMarker) == 0) len = 0;
    if (len) {
      i += len;
      continue;
    }
    flush(i);
    const size_t bad = (p[i] == 0xe2 && i + 3 <= n && text.compare(i, 3, kSpaceMarker) == 0) ? 3 : 1;
    for (size_t k = 0; k < bad; ++k) out.push_back(byte_id_[p[i + k]]);
    i += bad;
    seg = i;
  }
  flush(n);
  return out;
}

std::vector<uint32_t> Tokenizer::encode_sentencepiece(std::string_view text) const {
  std::vector<int> ids;
  return encode_with(text, [&](std::string_view segment, std::vector<uint32_t>& out) {
    ids.clear();
    auto st = sp_->Encode(segment, &ids);
    if (!st.ok()) throw Error(name_ + ": encode failed: " + st.ToString());
    for (int id : ids) out.push_back(static_cast<uint32_t>(id));
  });
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  if (!fast_) return encode_sentencepiece(text);
  return encode_with(text, [&](std::string_view segment, std::vector<uint32_t>& out) { fast_->encode(segment, out); });
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool render_specials) const {
  std::string out;
  for (uint32_t id : ids) {
    if (id >= bytes_.size())
      throw Error(name_ + ": token id " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(bytes_.size()));
    if (special_[id]) {
      if (render_specials) out += special_names_.at(id);
    } else {
      out += bytes_[id];
    }
  }
  return out;
}

uint32_t Tokenizer::special_id(const std::string& name) const {
  const auto it = special_by_name_.find(name);
  if (it == special_by_name_.end()) throw Error(name_ + ": no special token " + name);
  return it->second;
}

const std::string& Tokenizer::piece(uint32_t id) const {
  if (id >= bytes_.size()) throw Error(name_ + ": token id " + std::to_string(id) + " out of range");
  if (special_[id]) return special_names_.at(id);
  return sp_->IdToPiece(static_cast<int>(id));
}

std::vector<std::string> split_sentences(std::string_view text, size_t max_bytes) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < text.size()) {
    size_t end = std::min(text.size(), p + max_bytes);
    if (end < text.size()) {
      size_t nl = text.rfind('\n', end - 1);
      if (nl != std::string_view::npos && nl >= p) end = nl + 1;
      else {
        // No newline: cut before a UTF-8 continuation byte never.
        while (end > p + 1 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;
      }
    }
    out.emplace_back(text.substr(p, end - p));
    p = end;
  }
  return out;
}

namespace {

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

}  // namespace

TokenizerTrainReport train_tokenizer(const TokenizerTrainOptions& o, const ProgressFn& progress) {
  if (o.inputs.empty()) throw Error("tokenizer train: no inputs");
  if (o.output.empty()) throw Error("tokenizer train: no output path");
  if (o.vocab_size < 256 + 4 + tokenizer_control_symbols().size() + 16)
    throw Error("tokenizer train: vocab_size " + std::to_string(o.vocab_size) + " is too small");
  TokenizerTrainReport rep;
  std::vector<std::string> sentences;
  // Sample documents with probability max_bytes / total, by a hash of their identity (deterministic).
  const uint64_t total = text_input_bytes(o.inputs);
  const double keep = total > o.max_bytes ? static_cast<double>(o.max_bytes) / static_cast<double>(total) : 1.0;
  uint64_t seen = 0;
  for_each_text_document(o.inputs, [&](const TextDocument& d) {
    seen += d.raw_bytes;
    if (progress) progress(seen, total);
    if (keep < 1.0 && unit_interval(hash64(d.id, o.seed)) >= keep) return;
    if (!is_clean_text(d.text)) return;
    ++rep.documents;
    rep.bytes += d.text.size();
    for (auto& s : split_sentences(d.text, o.max_sentence_bytes)) sentences.push_back(std::move(s));
  });
  rep.sentences = sentences.size();
  if (sentences.empty()) throw Error("tokenizer train: the inputs hold no usable text");

  std::string controls;
  for (const auto& s : tokenizer_control_symbols()) controls += (controls.empty() ? "" : ",") + s;
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "0.9999"},
      {"max_sentence_length", std::to_string(o.max_sentence_bytes + 16)},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(std::max(1, o.threads))},
      {"seed_sentencepiece_size", "1000000"},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"pad_piece", "<|pad|>"},
      {"unk_piece", "<|unk|>"},
      {"bos_piece", "<|bos|>"},
      {"eos_piece", "<|eos|>"},
      {"control_symbols", controls},
      {"minloglevel", "2"},
  };
  VectorIterator it(sentences);
  std::string model;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  if (!st.ok()) throw Error("tokenizer train: sentencepiece failed: " + st.ToString());
  auto tok = Tokenizer::from_serialized(model, o.output);  // validates byte fallback and specials
  rep.vocab_size = tok.vocab_size();
  make_parent_dirs(o.output);
  std::ofstream out(o.output, std::ios::binary);
  out << model;
  if (!out) throw Error(o.output + ": cannot write tokenizer model");
  return rep;
}

}  // namespace slm::data
