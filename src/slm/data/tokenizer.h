#pragma once
// The code tokenizer: a sentencepiece BPE model (byte fallback, split digits, identity normalization, whitespace
// runs kept) wrapped so that decode(encode(x)) == x for ANY byte string. sentencepiece alone is lossy on three
// inputs: invalid UTF-8 (replaced by U+FFFD), U+2581 "▁" (its internal space marker) and NUL. This wrapper sends
// those bytes straight to the byte-fallback ids <0xNN> and decodes every id from its own byte table.
//
// Encoding runs an exact re-implementation of sentencepiece's BPE (bpe_encoder.h) when the model allows it (every
// model train_tokenizer makes does): the same ids as sentencepiece, 20-40x faster (bench/RESULTS.md).
//
// Special tokens are sentencepiece control symbols: they are never produced from text (a literal "<|user|>" in
// a file encodes as ordinary pieces) and decode to nothing unless asked to render them. A model made before a
// reserved symbol got its use knows it by its new name (<|reserved_0|> is <|file_sep|>, see tokenizer.cpp).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "slm/util/progress.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace slm::data {

class BpeEncoder;

// The special tokens, in id order after <|pad|>=0 <|unk|>=1 <|bos|>=2 <|eos|>=3. docs/formats.md lists their use.
const std::vector<std::string>& tokenizer_control_symbols();

class Tokenizer {
 public:
  static Tokenizer load(const std::string& model_path);
  static Tokenizer from_serialized(const std::string& model_bytes, const std::string& name = "<memory>");
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<uint32_t> encode(std::string_view text) const;
  // The same ids computed by sentencepiece's own encoder (the reference for the fast encoder; benchmarks).
  std::vector<uint32_t> encode_sentencepiece(std::string_view text) const;
  // Exact bytes of the ids. Specials decode to "" unless render_specials (then their names, e.g. "<|bos|>").
  // Throws slm::Error for ids outside the vocabulary.
  std::string decode(const std::vector<uint32_t>& ids, bool render_specials = false) const;

  uint32_t vocab_size() const { return static_cast<uint32_t>(bytes_.size()); }
  uint32_t pad_id() const { return pad_; }
  uint32_t bos_id() const { return bos_; }
  uint32_t eos_id() const { return eos_; }
  // Id of a special token by name ("<|fim_prefix|>"; renamed reserved symbols by their new names only); throws
  // when the model lacks it.
  uint32_t special_id(const std::string& name) const;
  bool is_special(uint32_t id) const { return id < special_.size() && special_[id]; }
  // The model's piece of an id; a special's name (as special_id and decode with render_specials know it).
  const std::string& piece(uint32_t id) const;
  const std::string& name() const { return name_; }

 private:
  Tokenizer();
  template <class EncodeSegment>
  std::vector<uint32_t> encode_with(std::string_view text, EncodeSegment encode_segment) const;
  std::string name_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::string> bytes_;  // per id: the exact bytes it decodes to
  std::vector<bool> special_;
  std::unordered_map<uint32_t, std::string> special_names_;  // per special id: its name (after the renames)
  std::unordered_map<std::string, uint32_t> special_by_name_;
  uint32_t byte_id_[256] = {};
  uint32_t pad_ = 0, bos_ = 0, eos_ = 0;
  std::unique_ptr<BpeEncoder> fast_;  // null when the model needs sentencepiece's own encoder
};

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // files, directories (recursively: text files) or corpus .jsonl files ("text")
  std::string output;               // the .model file to write
  uint32_t vocab_size = 32768;
  uint64_t max_bytes = 40'000'000;  // sample at most this many bytes of text, spread evenly over the inputs
  uint32_t max_sentence_bytes = 4000;  // documents are cut at line ends into "sentences" of at most this size
  uint64_t seed = 0;
  int threads = 2;
};

struct TokenizerTrainReport {
  uint64_t documents = 0, bytes = 0, sentences = 0;
  uint32_t vocab_size = 0;
};

// Trains and writes the model. Throws slm::Error for bad options or when sentencepiece fails.
TokenizerTrainReport train_tokenizer(const TokenizerTrainOptions& options, const ProgressFn& progress = {});

// Splits a document into sentencepiece training sentences of at most max_bytes, cut after a newline when
// possible (exposed for tests).
std::vector<std::string> split_sentences(std::string_view text, size_t max_bytes);

}  // namespace slm::data
