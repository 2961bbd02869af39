#include "slm/data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "slm/data/hashing.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::data {

namespace fs = std::filesystem;

namespace {

// Header layout (little-endian, 64 bytes):
//   0 magic[8]  8 u32 version  12 u32 dtype(bytes/token)  16 u32 vocab_size  20 u32 header_bytes
//  24 u64 token_count  32 u64 doc_count  40 u64 offsets_offset
//  48 u32 tokens_crc32c  52 u32 offsets_crc32c  56 u32 flags(0)  60 u32 header_crc32c (of bytes 0..59)
struct RawHeader {
  char magic[8];
  uint32_t version, dtype, vocab_size, header_bytes;
  uint64_t token_count, doc_count, offsets_offset;
  uint32_t tokens_crc, offsets_crc, flags, header_crc;
};
static_assert(sizeof(RawHeader) == kShardHeaderBytes);

uint64_t align8(uint64_t x) { return (x + 7) & ~uint64_t{7}; }

void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n && std::fwrite(p, 1, n, f) != n) throw Error(path + ": write failed: " + std::strerror(errno));
}

std::string sidecar_path(const std::string& shard) { return shard + ".json"; }

}  // namespace

TokenDtype dtype_for_vocab(uint64_t vocab_size) {
  if (vocab_size == 0) throw Error("token shard: vocab_size must be positive");
  if (vocab_size > (uint64_t{1} << 32)) throw Error("token shard: vocab_size " + std::to_string(vocab_size) + " exceeds 2^32");
  return vocab_size <= 65536 ? TokenDtype::kU16 : TokenDtype::kU32;
}

const char* dtype_name(TokenDtype d) { return d == TokenDtype::kU16 ? "uint16" : "uint32"; }

nlohmann::json DocumentMeta::to_json() const {
  return {{"package", package}, {"path", path}, {"license", license}, {"domain", domain}};
}

DocumentMeta DocumentMeta::from_json(const nlohmann::json& j) {
  DocumentMeta m;
  m.package = j.value("package", "");
  m.path = j.value("path", "");
  m.license = j.value("license", "");
  m.domain = j.value("domain", "");
  return m;
}

// ---------------------------------------------------------------------------------------------- writer

ShardWriter::ShardWriter(std::string path, uint64_t vocab_size, nlohmann::json extra)
    : path_(std::move(path)), vocab_(vocab_size), dtype_(dtype_for_vocab(vocab_size)), extra_(std::move(extra)) {
  std::string tmp = path_ + ".tmp";
  f_ = std::fopen(tmp.c_str(), "wb");
  if (!f_) throw Error(tmp + ": cannot create token shard: " + std::strerror(errno));
  RawHeader zero{};
  write_all(f_, &zero, sizeof zero, tmp);  // placeholder, rewritten by close()
}

ShardWriter::~ShardWriter() {
  if (!closed_ && f_) {
    std::fclose(f_);
    std::remove((path_ + ".tmp").c_str());
  }
}

void ShardWriter::add_document(std::span<const uint32_t> tokens, const DocumentMeta& meta) {
  if (closed_) throw Error(path_ + ": add_document after close");
  for (uint32_t t : tokens)
    if (t >= vocab_)
      throw Error(path_ + ": token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(vocab_));
  const std::string tmp = path_ + ".tmp";
  if (dtype_ == TokenDtype::kU16) {
    std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
    write_all(f_, narrow.data(), narrow.size() * 2, tmp);
    crc_ = crc32c(narrow.data(), narrow.size() * 2, crc_);
  } else {
    write_all(f_, tokens.data(), tokens.size() * 4, tmp);
    crc_ = crc32c(tokens.data(), tokens.size() * 4, crc_);
  }
  tokens_ += tokens.size();
  offsets_.push_back(tokens_);
  auto j = meta.to_json();
  j["tokens"] = tokens.size();
  docs_.push_back(std::move(j));
}

void ShardWriter::close() {
  if (closed_) return;
  const std::string tmp = path_ + ".tmp";
  const uint64_t width = static_cast<uint64_t>(dtype_);
  const uint64_t token_end = kShardHeaderBytes + tokens_ * width;
  const uint64_t offsets_offset = align8(token_end);
  static const char pad[8] = {};
  write_all(f_, pad, offsets_offset - token_end, tmp);
  write_all(f_, offsets_.data(), offsets_.size() * 8, tmp);

  RawHeader h{};
  std::memcpy(h.magic, kShardMagic, 8);
  h.version = kShardVersion;
  h.dtype = static_cast<uint32_t>(dtype_);
  h.vocab_size = static_cast<uint32_t>(vocab_ == (uint64_t{1} << 32) ? 0 : vocab_);
  h.header_bytes = kShardHeaderBytes;
  h.token_count = tokens_;
  h.doc_count = offsets_.size() - 1;
  h.offsets_offset = offsets_offset;
  h.tokens_crc = crc_;
  h.offsets_crc = crc32c(offsets_.data(), offsets_.size() * 8);
  h.flags = 0;
  h.header_crc = crc32c(&h, offsetof(RawHeader, header_crc));
  if (std::fseek(f_, 0, SEEK_SET) != 0) throw Error(tmp + ": seek failed");
  write_all(f_, &h, sizeof h, tmp);
  if (std::fflush(f_) != 0 || std::fclose(f_) != 0) {
    f_ = nullptr;
    throw Error(tmp + ": write failed: " + std::strerror(errno));
  }
  f_ = nullptr;

  nlohmann::json side = {{"format", "slm-token-shard-meta"},
                         {"version", kShardVersion},
                         {"shard", fs::path(path_).filename().string()},
                         {"vocab_size", vocab_},
                         {"dtype", dtype_name(dtype_)},
                         {"token_count", tokens_},
                         {"doc_count", offsets_.size() - 1},
                         {"tokens_crc32c", crc_},
                         {"extra", extra_},
                         {"documents", docs_}};
  const std::string side_tmp = sidecar_path(path_) + ".tmp";
  {
    std::ofstream out(side_tmp, std::ios::binary);
    out << side.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out) throw Error(side_tmp + ": write failed");
  }
  fs::rename(side_tmp, sidecar_path(path_));
  fs::rename(tmp, path_);
  closed_ = true;
}

// ---------------------------------------------------------------------------------------------- reader

std::shared_ptr<const Shard> Shard::open(const std::string& path, bool verify) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open token shard: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat token shard: " + std::strerror(errno));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    throw Error(path + ": truncated token shard: " + std::to_string(size) + " bytes, smaller than the " +
                std::to_string(kShardHeaderBytes) + "-byte header");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw Error(path + ": cannot map token shard: " + std::strerror(errno));
  std::shared_ptr<Shard> s(new Shard());
  s->path_ = path;
  s->map_ = map;
  s->map_len_ = size;

  RawHeader h;
  std::memcpy(&h, map, sizeof h);
  if (std::memcmp(h.magic, kShardMagic, 8) != 0) throw Error(path + ": not an slm token shard (bad magic)");
  if (crc32c(&h, offsetof(RawHeader, header_crc)) != h.header_crc)
    throw Error(path + ": corrupt token shard: header checksum mismatch");
  if (h.version != kShardVersion)
    throw Error(path + ": token shard version " + std::to_string(h.version) + " is not supported (this build reads " +
                std::to_string(kShardVersion) + ")");
  if (h.dtype != 2 && h.dtype != 4) throw Error(path + ": corrupt token shard: bad dtype " + std::to_string(h.dtype));
  if (h.header_bytes != kShardHeaderBytes) throw Error(path + ": corrupt token shard: bad header size");
  const uint64_t vocab = h.vocab_size == 0 ? (uint64_t{1} << 32) : h.vocab_size;
  if (static_cast<uint32_t>(dtype_for_vocab(vocab)) != h.dtype)
    throw Error(path + ": corrupt token shard: dtype does not match vocab_size " + std::to_string(vocab));
  const uint64_t token_end = kShardHeaderBytes + h.token_count * h.dtype;
  if (h.token_count > size || h.doc_count > size || h.offsets_offset != align8(token_end))
    throw Error(path + ": corrupt token shard: inconsistent header counts");
  const uint64_t expect = h.offsets_offset + (h.doc_count + 1) * 8;
  if (size < expect)
    throw Error(path + ": truncated token shard: " + std::to_string(size) + " bytes, the header promises " +
                std::to_string(expect));
  if (size > expect)
    throw Error(path + ": corrupt token shard: " + std::to_string(size - expect) + " trailing bytes after the offsets");

  s->vocab_ = h.vocab_size;
  s->dtype_ = static_cast<TokenDtype>(h.dtype);
  s->tokens_ = h.token_count;
  s->docs_ = h.doc_count;
  s->tokens_crc_ = h.tokens_crc;
  const auto* base = static_cast<const unsigned char*>(map);
  s->tokens_ptr_ = base + kShardHeaderBytes;
  s->offsets_ = reinterpret_cast<const uint64_t*>(base + h.offsets_offset);
  if (crc32c(s->offsets_, (h.doc_count + 1) * 8) != h.offsets_crc)
    throw Error(path + ": corrupt token shard: document offsets checksum mismatch");
  if (s->offsets_[0] != 0 || s->offsets_[h.doc_count] != h.token_count)
    throw Error(path + ": corrupt token shard: document offsets do not span the tokens");
  for (uint64_t d = 0; d < h.doc_count; ++d)
    if (s->offsets_[d] > s->offsets_[d + 1])
      throw Error(path + ": corrupt token shard: document offsets decrease at document " + std::to_string(d));
  if (verify && crc32c(s->tokens_ptr_, h.token_count * h.dtype) != h.tokens_crc)
    throw Error(path + ": corrupt token shard: token checksum mismatch");
  return s;
}

Shard::~Shard() {
  if (map_) munmap(map_, map_len_);
}

uint32_t Shard::token(uint64_t i) const {
  if (dtype_ == TokenDtype::kU16) {
    uint16_t v;
    std::memcpy(&v, tokens_ptr_ + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ptr_ + i * 4, 4);
  return v;
}

void Shard::copy_tokens(uint64_t begin, uint64_t n, int64_t* out) const {
  if (begin + n > tokens_) throw Error(path_ + ": token range past the end of the shard");
  if (dtype_ == TokenDtype::kU16) {
    const auto* p = reinterpret_cast<const uint16_t*>(tokens_ptr_) + begin;  // 64-byte header keeps alignment
    for (uint64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(tokens_ptr_) + begin;
    for (uint64_t i = 0; i < n; ++i) out[i] = p[i];
  }
}

uint64_t Shard::doc_at(uint64_t pos) const {
  // The last document whose start is <= pos (empty documents share a start; take the last).
  const uint64_t* end = offsets_ + docs_ + 1;
  auto it = std::upper_bound(offsets_, end, pos);
  return static_cast<uint64_t>(it - offsets_) - 1;
}

std::vector<uint32_t> Shard::document(uint64_t d) const {
  if (d >= docs_) throw Error(path_ + ": document " + std::to_string(d) + " out of range");
  std::vector<uint32_t> out;
  out.reserve(offsets_[d + 1] - offsets_[d]);
  for (uint64_t i = offsets_[d]; i < offsets_[d + 1]; ++i) out.push_back(token(i));
  return out;
}

nlohmann::json Shard::sidecar() const {
  const std::string p = sidecar_path(path_);
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p + ": missing sidecar of token shard " + path_);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(p + ": corrupt sidecar: " + e.what());
  }
  auto num = [&](const char* k) -> uint64_t {
    if (!j.contains(k) || !j[k].is_number_unsigned()) throw Error(p + ": sidecar lacks '" + k + "'");
    return j[k].get<uint64_t>();
  };
  if (num("token_count") != tokens_ || num("doc_count") != docs_ || num("tokens_crc32c") != tokens_crc_)
    throw Error(p + ": sidecar does not belong to " + path_ + " (counts or checksum differ)");
  if (!j.contains("documents") || !j["documents"].is_array() || j["documents"].size() != docs_)
    throw Error(p + ": sidecar 'documents' does not list " + std::to_string(docs_) + " documents");
  return j;
}

std::vector<DocumentMeta> Shard::metadata() const {
  auto j = sidecar();
  std::vector<DocumentMeta> out;
  out.reserve(docs_);
  for (const auto& d : j["documents"]) {
    try {
      out.push_back(DocumentMeta::from_json(d));
    } catch (const nlohmann::json::exception& e) {  // an entry that is not an object, a field that is not a string
      throw Error(sidecar_path(path_) + ": corrupt sidecar: document " + std::to_string(out.size()) + ": " + e.what());
    }
  }
  return out;
}

std::vector<std::string> list_shards(const std::string& dir_or_file) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::is_directory(dir_or_file, ec)) {
    for (const auto& e : fs::directory_iterator(dir_or_file)) {
      const std::string name = e.path().filename().string();
      if (e.is_regular_file() && name.size() > 7 && name.ends_with(kShardExtension)) out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    if (out.empty()) throw Error(dir_or_file + ": no " + std::string(kShardExtension) + " token shards in this directory");
  } else {
    if (!fs::exists(dir_or_file, ec)) throw Error(dir_or_file + ": no such token shard or directory");
    out.push_back(dir_or_file);
  }
  return out;
}

std::vector<std::string> write_synthetic_shards(const std::string& dir, const std::string& prefix, uint64_t vocab,
                                                uint64_t docs, uint64_t min_len, uint64_t max_len, uint64_t shards,
                                                uint64_t seed, uint32_t first_id) {
  if (shards == 0 || max_len < min_len || first_id >= vocab) throw Error("write_synthetic_shards: bad arguments");
  make_dirs(dir);
  std::mt19937_64 rng(seed);
  std::vector<std::string> paths;
  uint64_t doc = 0;
  for (uint64_t s = 0; s < shards; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "-%05llu", static_cast<unsigned long long>(s));
    std::string path = (fs::path(dir) / (prefix + name + kShardExtension)).string();
    ShardWriter w(path, vocab, {{"synthetic_seed", seed}});
    const uint64_t n = docs / shards + (s < docs % shards ? 1 : 0);
    for (uint64_t i = 0; i < n; ++i, ++doc) {
      const uint64_t len = min_len + rng() % (max_len - min_len + 1);
      std::vector<uint32_t> toks(len);
      for (auto& t : toks) t = first_id + static_cast<uint32_t>(rng() % (vocab - first_id));
      w.add_document(toks, {"synthetic", prefix + "/doc" + std::to_string(doc), "CC0-1.0", "synthetic"});
    }
    w.close();
    paths.push_back(path);
  }
  return paths;
}

}  // namespace slm::data
