#pragma once
// Duplicate detection for the corpora: exact (a 128-bit content hash) and near (MinHash signatures over
// shingles of code tokens, banded LSH to find candidates, then the signatures' agreement as the Jaccard
// estimate). Documents are offered in a fixed order; the first of a duplicate group is kept.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace slm::data {

// Code-aware word tokens: identifier/number runs and single punctuation characters; whitespace separates and
// is dropped (so re-indented or re-wrapped copies still match). Returns 64-bit hashes of the tokens.
std::vector<uint64_t> code_token_hashes(std::string_view text);

struct MinHashOptions {
  int shingle = 5;       // tokens per shingle
  int bands = 16;        // LSH bands
  int rows = 8;          // rows per band: bands * rows hash functions
  double threshold = 0.8;  // estimated Jaccard at or above which a document is a near-duplicate
  uint64_t seed = 0x6d696e68617368ULL;
};

std::vector<uint32_t> minhash_signature(const std::vector<uint64_t>& token_hashes, const MinHashOptions& o);
double signature_similarity(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);

class Deduplicator {
 public:
  explicit Deduplicator(MinHashOptions o = {}) : opt_(o), buckets_(static_cast<size_t>(o.bands)) {}

  enum class Verdict { kUnique, kExact, kNear };
  struct Result {
    Verdict verdict = Verdict::kUnique;
    int64_t duplicate_of = -1;  // id of the kept document it duplicates
    double similarity = 0;
  };
  // Checks document `id` against those kept so far; keeps it (indexes it) when it is unique.
  Result offer(int64_t id, std::string_view text);
  size_t kept() const { return kept_; }

 private:
  MinHashOptions opt_;
  std::unordered_map<uint64_t, int64_t> exact_;  // content hash -> kept id (second hash checked in `exact2_`)
  std::unordered_map<int64_t, uint64_t> exact2_;
  std::vector<std::unordered_map<uint64_t, std::vector<uint32_t>>> buckets_;  // per band: band hash -> slots
  std::vector<std::vector<uint32_t>> signatures_;
  std::vector<int64_t> slot_ids_;
  size_t kept_ = 0;
};

}  // namespace slm::data
