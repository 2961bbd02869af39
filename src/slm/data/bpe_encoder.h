#pragma once
// An exact re-implementation of sentencepiece's BPE encoder (bpe_model.cc, 0.1.97) for models without
// normalization rules, 20-40x faster on source code than sentencepiece itself (bench/RESULTS.md).
//
// sentencepiece merges the adjacent pair of symbols whose concatenation is the highest-scoring vocabulary piece
// (ties: the leftmost pair) until no adjacent pair is a piece. This encoder runs the same merge loop, and adds
// two things that cannot change its result:
//  - It cuts the text into chunks between two characters x, y whenever no vocabulary piece contains xy. A merged
//    symbol is always a vocabulary piece, so no merge can ever span such a cut, and the merges on one side never
//    create or remove a candidate pair on the other side: each chunk's merges (in their relative order) are the
//    same as when the whole text is encoded at once. With this project's training options (split digits, spaces
//    only at the start of a piece) code falls into short chunks such as "    return", " x", "();\n".
//  - It remembers the ids of recent short chunks (a bounded table, cleared when full): source code repeats its
//    identifiers, keywords and indentation constantly.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace slm::data {

class BpeEncoder {
 public:
  // Builds the encoder from a serialized sentencepiece ModelProto. Returns nullptr, with the reason in *why_not,
  // when the model uses something this encoder does not reproduce: another model type, normalization rules,
  // dummy prefix, whitespace removal or no whitespace escaping, no byte fallback, user-defined or unused pieces.
  // max_cached_chunks bounds the table of recent chunks (tests make it tiny).
  static std::unique_ptr<BpeEncoder> create(const std::string& model_bytes, std::string* why_not,
                                            size_t max_cached_chunks = kMaxCachedChunks);

  // Appends the ids of text. The text must be valid UTF-8 without NUL and without U+2581 (sentencepiece alters
  // those; Tokenizer::encode sends them to byte ids before calling this). Safe to call from several threads.
  void encode(std::string_view text, std::vector<uint32_t>& out) const;

  // Bounds of the chunk table: chunks longer than kMaxCachedChunk bytes are not kept, and the table is cleared
  // when it holds kMaxCachedChunks chunks: under 10 MB for code (50 MB at most); 24 MB of C++ has fewer
  // distinct chunks than that.
  static constexpr size_t kMaxCachedChunk = 64;
  static constexpr size_t kMaxCachedChunks = size_t{1} << 17;

 private:
  struct Piece {
    uint32_t id;
    float score;
  };
  // A hash table of short strings (open addressing, keys copied into one arena): lookups of pieces and chunks
  // are most of the encoder's work, and std::unordered_map's nodes cost a cache miss each.
  template <class V>
  class StringTable {
   public:
    const V* find(std::string_view key) const;
    void insert(std::string_view key, V value);  // key must be absent
    size_t size() const { return size_; }
    void clear();

   private:
    struct Slot {
      uint64_t hash;
      uint32_t offset, len;  // len 0: empty (keys are never empty)
      V value;
    };
    std::vector<Slot> slots_;
    std::string arena_;
    size_t size_ = 0;
  };
  struct Cache {
    StringTable<std::pair<uint32_t, uint32_t>> chunks;  // offset and count in ids
    std::vector<uint32_t> ids;
  };
  struct Scratch;

  BpeEncoder() = default;
  void encode_chunk(std::string_view chunk, Scratch& scratch, std::vector<uint32_t>& out) const;
  void append_char(std::string_view c, std::vector<uint32_t>& out) const;

  // Mergeable pieces (sentencepiece's NORMAL pieces), keyed by their text with U+2581 written back as a space.
  StringTable<Piece> pieces_;
  // The id of a single character that stays unmerged (sentencepiece looks up control, byte and unknown pieces
  // first); characters that are no piece become byte-fallback ids.
  uint32_t ascii_id_[128];
  std::unordered_map<uint32_t, uint32_t> char_id_;  // key: the character's UTF-8 bytes packed little-endian
  uint32_t byte_id_[256];
  // Whether some piece contains character a directly followed by character b: ascii_join_ for two ASCII
  // characters, join_ (packed a << 32 | packed b) otherwise.
  bool ascii_join_[128][128];
  std::unordered_set<uint64_t> join_;
  size_t max_cached_chunks_ = kMaxCachedChunks;
  mutable std::mutex cache_mu_;
  mutable Cache cache_;
};

}  // namespace slm::data
