#include "slm/data/loader.h"

#include <algorithm>
#include <bit>

#include "slm/data/hashing.h"
#include "slm/util/error.h"

namespace slm::data {

uint64_t permute_index(uint64_t x, uint64_t n, uint64_t key) {
  if (x >= n) throw Error("permute_index: index out of range");
  if (n <= 1) return 0;
  const int bits = 64 - std::countl_zero(n - 1);  // smallest power of two >= n
  const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  const int shift = std::max(1, bits / 2);
  uint64_t k[4], c[4];
  for (int r = 0; r < 4; ++r) {
    k[r] = mix64(key + 0x9e3779b97f4a7c15ULL * (2 * r + 1)) | 1;  // odd: a bijection mod 2^bits
    c[r] = mix64(key + 0x9e3779b97f4a7c15ULL * (2 * r + 2));
  }
  do {
    for (int r = 0; r < 4; ++r) {
      x = (x ^ (x >> shift)) & mask;
      x = (x * k[r] + c[r]) & mask;
    }
  } while (x >= n);
  return x;
}

nlohmann::json LoaderCursor::to_json() const {
  return {{"samples", samples}, {"drawn", drawn}, {"fingerprint", fingerprint}};
}

LoaderCursor LoaderCursor::from_json(const nlohmann::json& j) {
  LoaderCursor c;
  try {
    c.samples = j.at("samples").get<uint64_t>();
    c.drawn = j.at("drawn").get<std::vector<uint64_t>>();
    c.fingerprint = j.at("fingerprint").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("loader cursor: malformed JSON: ") + e.what());
  }
  return c;
}

TokenLoader::TokenLoader(std::vector<ShardSource> sources, LoaderOptions options) : opt_(options) {
  if (sources.empty()) throw Error("token loader: no sources");
  if (opt_.batch_size < 1 || opt_.seq_len < 1) throw Error("token loader: batch_size and seq_len must be positive");
  if (opt_.world_size < 1 || opt_.rank < 0 || opt_.rank >= opt_.world_size)
    throw Error("token loader: rank " + std::to_string(opt_.rank) + " is outside world_size " +
                std::to_string(opt_.world_size));
  const auto T = static_cast<uint64_t>(opt_.seq_len);
  uint64_t fp = mix64(opt_.seed ^ 0x5eedULL) ^ mix64(T);
  double sum = 0;
  uint32_t vocab = 0;
  for (auto& in : sources) {
    if (!(in.weight > 0)) throw Error("token loader: source '" + in.name + "' needs a positive weight");
    if (in.shards.empty()) throw Error("token loader: source '" + in.name + "' has no shards");
    Source s;
    s.name = in.name;
    s.weight = in.weight;
    uint64_t all = 0;
    for (const auto& p : in.shards) {
      auto sh = Shard::open(p, opt_.verify_checksums);
      if (vocab && sh->vocab_size() != vocab)
        throw Error(p + ": vocab_size " + std::to_string(sh->vocab_size()) + " differs from the other shards' " +
                    std::to_string(vocab));
      vocab = sh->vocab_size();
      s.starts.push_back(all);
      all += sh->token_count();
      fp = mix64(fp ^ hash64(std::to_string(sh->token_count()) + ":" + std::to_string(sh->tokens_crc())));
      s.shards.push_back(std::move(sh));
    }
    const uint64_t end = std::min(in.end, all);
    if (in.begin > end)
      throw Error("token loader: source '" + s.name + "' starts at token " + std::to_string(in.begin) +
                  ", past its end " + std::to_string(end));
    s.begin = in.begin;
    s.total = end - in.begin;
    // Only a partial range enters the fingerprint: cursors saved over whole sources stay valid.
    if (s.total != all) fp = mix64(fp ^ hash64("range:" + std::to_string(s.begin) + ":" + std::to_string(end)));
    if (s.total < T + 1)
      throw Error("token loader: source '" + s.name + "' has " + std::to_string(s.total) +
                  " tokens, fewer than one window of " + std::to_string(T + 1));
    s.windows = (s.total - 1) / T;
    fp = mix64(fp ^ hash64(s.name));
    sum += s.weight;
    sources_.push_back(std::move(s));
  }
  for (const auto& s : sources_) cumulative_.push_back((cumulative_.empty() ? 0.0 : cumulative_.back()) + s.weight / sum);
  cumulative_.back() = 1.0;
  fingerprint_ = fp;
  drawn_.assign(sources_.size(), 0);
}

size_t TokenLoader::pick_source(uint64_t sample) const {
  if (sources_.size() == 1) return 0;
  const double u = unit_interval(mix64(opt_.seed) ^ (sample * 0xd1b54a32d192ed03ULL));
  auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
  return std::min<size_t>(static_cast<size_t>(it - cumulative_.begin()), sources_.size() - 1);
}

uint64_t TokenLoader::permuted(size_t s, uint64_t k) const {
  const uint64_t W = sources_[s].windows;
  const uint64_t epoch = k / W;
  const uint64_t key = mix64(mix64(opt_.seed ^ (0xa0761d6478bd642fULL * (s + 1))) ^ epoch);
  return permute_index(k % W, W, key);
}

void TokenLoader::read_window(size_t si, uint64_t w, int64_t* tokens, int32_t* doc_ids) const {
  const Source& s = sources_.at(si);
  if (w >= s.windows) throw Error("token loader: window out of range");
  const uint64_t T = static_cast<uint64_t>(opt_.seq_len);
  uint64_t pos = s.begin + w * T;
  const uint64_t end = pos + T + 1;
  size_t shard = static_cast<size_t>(std::upper_bound(s.starts.begin(), s.starts.end(), pos) - s.starts.begin()) - 1;
  int32_t seg = 0;
  uint64_t out = 0;
  while (pos < end) {
    // Skip empty shards.
    while (s.starts[shard] + s.shards[shard]->token_count() <= pos) ++shard;
    const Shard& sh = *s.shards[shard];
    const uint64_t local = pos - s.starts[shard];
    const uint64_t n = std::min(end - pos, sh.token_count() - local);
    sh.copy_tokens(local, n, tokens + out);
    // Segment ids: +1 at every document start after the window's first token. A shard's first token starts a
    // document; inside a shard the starts are the offsets (empty documents share a start and count once).
    uint64_t d = sh.doc_at(local);
    uint64_t next_start = sh.doc_begin(d + 1);  // > local; token_count() for the last document
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t p = local + i;
      bool start = false;
      if (i == 0) {
        start = local == 0 && out > 0;
      } else if (p == next_start) {
        start = true;
        d = sh.doc_at(p);
        next_start = sh.doc_begin(d + 1);
      }
      if (start) ++seg;
      doc_ids[out + i] = seg;
    }
    out += n;
    pos += n;
    ++shard;
  }
}

Batch TokenLoader::next() {
  const int64_t B = opt_.batch_size, T1 = opt_.seq_len + 1;
  Batch b;
  b.tokens = torch::empty({B, T1}, torch::kLong);
  b.doc_ids = torch::empty({B, T1}, torch::kInt);
  b.source = torch::empty({B}, torch::kLong);
  auto* tok = b.tokens.data_ptr<int64_t>();
  auto* seg = b.doc_ids.data_ptr<int32_t>();
  auto* src = b.source.data_ptr<int64_t>();
  const auto world = static_cast<uint64_t>(opt_.world_size), rank = static_cast<uint64_t>(opt_.rank);
  // Every rank walks all B * world global samples so that the per-source draw counts stay in step.
  for (int64_t row = 0; row < B; ++row) {
    for (uint64_t r = 0; r < world; ++r) {
      const uint64_t i = samples_++;
      const size_t s = pick_source(i);
      const uint64_t k = drawn_[s]++;
      if (r != rank) continue;
      const uint64_t w = permuted(s, k);
      read_window(s, w, tok + row * T1, seg + row * T1);
      src[row] = static_cast<int64_t>(s);
      b.window.push_back(w);
      b.sample.push_back(i);
    }
  }
  return b;
}

LoaderCursor TokenLoader::cursor() const { return {samples_, drawn_, fingerprint_}; }

void TokenLoader::restore(const LoaderCursor& c) {
  if (c.fingerprint != fingerprint_)
    throw Error("loader cursor: saved for a different seed, sequence length or shard set (fingerprint " +
                std::to_string(c.fingerprint) + ", this loader " + std::to_string(fingerprint_) + ")");
  if (c.drawn.size() != sources_.size()) throw Error("loader cursor: source count differs");
  uint64_t sum = 0;
  for (auto d : c.drawn) sum += d;
  if (sum != c.samples) throw Error("loader cursor: per-source draws do not add up to the sample count");
  samples_ = c.samples;
  drawn_ = c.drawn;
}

}  // namespace slm::data
