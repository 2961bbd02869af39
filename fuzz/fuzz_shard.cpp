// Token shards (data/shards.cpp), as `slm train` and `slm data inspect` open them: the .slmtok file and its
// .slmtok.json sidecar, given as one input "<shard bytes>\n--sidecar--\n<sidecar JSON>". The header's three
// CRC-32C fields are filled in by the harness wherever the ranges they cover lie inside the input (random
// mutations would never match them; a wrong checksum is one comparison, tried by the corpus). Bad input must be
// refused with slm::Error; a shard that opens must give every token, document and metadata entry it promises.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "slm/data/hashing.h"
#include "slm/data/shards.h"
#include "slm/util/error.h"

namespace {

template <class T>
T at(const std::string& s, size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof v);
  return v;
}
template <class T>
void put(std::string& s, size_t off, T v) {
  std::memcpy(s.data() + off, &v, sizeof v);
}

// The layout of data/shards.cpp's RawHeader.
void fix_checksums(std::string& s) {
  if (s.size() < slm::data::kShardHeaderBytes) return;
  const uint32_t dtype = at<uint32_t>(s, 12);
  const uint64_t tokens = at<uint64_t>(s, 24), docs = at<uint64_t>(s, 32), offsets_at = at<uint64_t>(s, 40);
  if ((dtype == 2 || dtype == 4) && tokens <= s.size() && 64 + tokens * dtype <= s.size())
    put(s, 48, slm::data::crc32c(s.data() + 64, tokens * dtype));
  if (docs <= s.size() && offsets_at <= s.size() && (docs + 1) * 8 <= s.size() - offsets_at)
    put(s, 52, slm::data::crc32c(s.data() + offsets_at, (docs + 1) * 8));
  put(s, 60, slm::data::crc32c(s.data(), 60));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [shard_part, sidecar] =
      slm::fuzz::split_input(std::string_view(reinterpret_cast<const char*>(data), size), "\n--sidecar--\n");
  std::string shard(shard_part);
  fix_checksums(shard);
  const std::string path = slm::fuzz::write_scratch("s.slmtok", shard);
  slm::fuzz::write_scratch("s.slmtok.json", sidecar);
  for (const bool verify : {false, true}) {
    try {
      const auto s = slm::data::Shard::open(path, verify);
      uint64_t n = 0;
      for (uint64_t d = 0; d < s->doc_count(); ++d) {
        const auto doc = s->document(d);
        if (!doc.empty() && s->doc_at(s->doc_begin(d)) != d) std::abort();
        n += doc.size();
      }
      if (n != s->token_count()) std::abort();
      std::vector<int64_t> all(s->token_count());
      s->copy_tokens(0, s->token_count(), all.data());
      if (!verify) (void)s->metadata();
    } catch (const slm::Error& e) {
      slm::fuzz::rejected(e);
    }
  }
  return 0;
}
