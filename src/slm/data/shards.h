#pragma once
// Token shards: memory-mapped binary files of token ids with document boundaries, plus a JSON sidecar of
// per-document metadata (source package, path, license, domain). The format is specified in docs/formats.md
// ("Token shards"). Readers verify the header, the file size and the CRC-32C checksums and reject corrupt or
// truncated files with an slm::Error that names the file.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace slm::data {

inline constexpr char kShardMagic[8] = {'S', 'L', 'M', 'T', 'O', 'K', 'S', '\0'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint64_t kShardHeaderBytes = 64;
inline constexpr const char* kShardExtension = ".slmtok";         // the token file
inline constexpr const char* kShardMetaExtension = ".slmtok.json";  // its sidecar (the token file's name + ".json")

// Bytes per token id: uint16 when the vocabulary fits (<= 65536 ids), else uint32.
enum class TokenDtype : uint32_t { kU16 = 2, kU32 = 4 };
TokenDtype dtype_for_vocab(uint64_t vocab_size);
const char* dtype_name(TokenDtype d);

struct DocumentMeta {
  std::string package;  // Debian package (or other origin) the text came from
  std::string path;     // path inside that origin
  std::string license;  // SPDX-like license name, or what the package's copyright file says
  std::string domain;   // cpp, cmake, shell, ...
  nlohmann::json to_json() const;
  static DocumentMeta from_json(const nlohmann::json& j);
};

// Writes one shard: tokens stream to "<path>.tmp"; close() appends the offsets, fills in the header, writes the
// sidecar and renames both into place, so a reader never sees a half-written shard.
class ShardWriter {
 public:
  ShardWriter(std::string path, uint64_t vocab_size, nlohmann::json extra = nlohmann::json::object());
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document (its tokens, as given: callers add BOS/EOS). Throws for ids >= vocab_size.
  void add_document(std::span<const uint32_t> tokens, const DocumentMeta& meta);
  void close();
  uint64_t token_count() const { return tokens_; }
  uint64_t doc_count() const { return offsets_.size() - 1; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t vocab_;
  TokenDtype dtype_;
  nlohmann::json extra_;
  std::FILE* f_ = nullptr;
  uint64_t tokens_ = 0;
  uint32_t crc_ = 0;
  std::vector<uint64_t> offsets_{0};
  nlohmann::json docs_ = nlohmann::json::array();
  bool closed_ = false;
};

// A read-only, memory-mapped shard.
class Shard {
 public:
  // verify: also check the token checksum (reads the whole file). The header, size and offsets are always checked.
  static std::shared_ptr<const Shard> open(const std::string& path, bool verify = true);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  uint32_t vocab_size() const { return vocab_; }
  TokenDtype dtype() const { return dtype_; }
  uint64_t token_count() const { return tokens_; }
  uint64_t doc_count() const { return docs_; }
  uint32_t tokens_crc() const { return tokens_crc_; }
  uint32_t token(uint64_t i) const;
  // Copies tokens [begin, begin + n) widened to int64.
  void copy_tokens(uint64_t begin, uint64_t n, int64_t* out) const;
  // Token offset where document d starts; doc_begin(doc_count()) == token_count().
  uint64_t doc_begin(uint64_t d) const { return offsets_[d]; }
  // The document that holds token position pos.
  uint64_t doc_at(uint64_t pos) const;
  std::vector<uint32_t> document(uint64_t d) const;
  // The sidecar's per-document metadata (checked against this shard's counts and checksum).
  std::vector<DocumentMeta> metadata() const;
  nlohmann::json sidecar() const;

 private:
  Shard() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t map_len_ = 0;
  const unsigned char* tokens_ptr_ = nullptr;
  const uint64_t* offsets_ = nullptr;
  uint32_t vocab_ = 0, tokens_crc_ = 0;
  TokenDtype dtype_ = TokenDtype::kU16;
  uint64_t tokens_ = 0, docs_ = 0;
};

// The shard files under a directory (sorted by name), or the given files; throws when none are found.
std::vector<std::string> list_shards(const std::string& dir_or_file);

// Writes synthetic shards for tests: `docs` documents of random length in [min_len, max_len], ids in
// [first_id, vocab), split over `shards` files named <dir>/<prefix>-NNNNN.slmtok. Returns the paths.
std::vector<std::string> write_synthetic_shards(const std::string& dir, const std::string& prefix, uint64_t vocab,
                                                uint64_t docs, uint64_t min_len, uint64_t max_len, uint64_t shards,
                                                uint64_t seed, uint32_t first_id = 0);

}  // namespace slm::data
