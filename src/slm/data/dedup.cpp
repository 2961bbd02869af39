#include "slm/data/dedup.h"

#include <algorithm>
#include <limits>

#include "slm/data/hashing.h"

namespace slm::data {

namespace {

inline bool is_word(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }
inline bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

std::vector<uint64_t> code_token_hashes(std::string_view text) {
  std::vector<uint64_t> out;
  out.reserve(text.size() / 4);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (is_space(p[i])) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    if (is_word(p[i]))
      while (j < n && is_word(p[j])) ++j;
    out.push_back(hash64(text.substr(i, j - i), 0x746f6bULL));
    i = j;
  }
  return out;
}

std::vector<uint32_t> minhash_signature(const std::vector<uint64_t>& toks, const MinHashOptions& o) {
  const size_t k = static_cast<size_t>(o.bands * o.rows);
  std::vector<uint32_t> sig(k, std::numeric_limits<uint32_t>::max());
  const size_t sh = static_cast<size_t>(std::max(1, o.shingle));
  if (toks.empty()) return sig;
  // Per-function parameters of h_i(x) = hi32(mix(x) * a_i + b_i) with odd a_i.
  std::vector<uint64_t> a(k), b(k);
  for (size_t i = 0; i < k; ++i) {
    a[i] = mix64(o.seed + 2 * i + 1) | 1;
    b[i] = mix64(o.seed + 2 * i + 2);
  }
  const size_t count = toks.size() >= sh ? toks.size() - sh + 1 : 1;
  for (size_t s = 0; s < count; ++s) {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (size_t t = s; t < std::min(toks.size(), s + sh); ++t) h = mix64(h ^ toks[t]);
    for (size_t i = 0; i < k; ++i) {
      const auto v = static_cast<uint32_t>((h * a[i] + b[i]) >> 32);
      if (v < sig[i]) sig[i] = v;
    }
  }
  return sig;
}

double signature_similarity(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  if (a.size() != b.size() || a.empty()) return 0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

Deduplicator::Result Deduplicator::offer(int64_t id, std::string_view text) {
  Result r;
  const uint64_t h1 = hash64(text, 0x65786163ULL), h2 = hash64(text, 0x74776f32ULL);
  if (auto it = exact_.find(h1); it != exact_.end() && exact2_[it->second] == h2) {
    r.verdict = Verdict::kExact;
    r.duplicate_of = it->second;
    r.similarity = 1.0;
    return r;
  }
  auto sig = minhash_signature(code_token_hashes(text), opt_);
  std::vector<uint64_t> band_keys(static_cast<size_t>(opt_.bands));
  for (int b = 0; b < opt_.bands; ++b) {
    uint64_t key = mix64(static_cast<uint64_t>(b) + 1);
    for (int row = 0; row < opt_.rows; ++row) key = mix64(key ^ sig[static_cast<size_t>(b * opt_.rows + row)]);
    band_keys[static_cast<size_t>(b)] = key;
  }
  double best = 0;
  int64_t best_id = -1;
  std::unordered_set<uint32_t> checked;
  for (int b = 0; b < opt_.bands; ++b) {
    auto& bucket = buckets_[static_cast<size_t>(b)];
    auto it = bucket.find(band_keys[static_cast<size_t>(b)]);
    if (it == bucket.end()) continue;
    for (uint32_t slot : it->second) {
      if (!checked.insert(slot).second) continue;
      const double s = signature_similarity(sig, signatures_[slot]);
      if (s > best) best = s, best_id = slot_ids_[slot];
    }
  }
  if (best_id >= 0 && best >= opt_.threshold) {
    r.verdict = Verdict::kNear;
    r.duplicate_of = best_id;
    r.similarity = best;
    return r;
  }
  // Keep: index it.
  exact_.emplace(h1, id);
  exact2_[id] = h2;
  const auto slot = static_cast<uint32_t>(signatures_.size());
  signatures_.push_back(std::move(sig));
  slot_ids_.push_back(id);
  for (int b = 0; b < opt_.bands; ++b) buckets_[static_cast<size_t>(b)][band_keys[static_cast<size_t>(b)]].push_back(slot);
  ++kept_;
  r.similarity = best;
  return r;
}

}  // namespace slm::data
