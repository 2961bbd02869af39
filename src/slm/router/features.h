#pragma once
// The router's features: hashed n-grams of a request, as a sparse L2-normalised vector. Three kinds, each hashed
// with its own seed into one table of 2^bucket_bits buckets:
//   - word unigrams and bigrams, where a word is a run of letters, digits and '_' (case kept: "CMAKE_" and
//     "cmake" say different things) and every other non-space byte is a one-byte word ("::", "${" and "->" then
//     appear as bigrams);
//   - byte n-grams of the raw text for n in [char_min, char_max] (catch what word splits miss: "ASan", "0x7f",
//     indentation, shell "$(");
//   - optionally word trigrams;
//   - optionally line shapes, which say where a token sits: per line its first two bytes as they are (a diff's
//     "+ ", "@@", "- ", a prompt's "$ ", reStructuredText's ".."), its first word after the indentation ("set",
//     "#", "static") and its last two non-space bytes ("::" opening an rST literal block, ");", "\").
// Each feature counts log(1 + occurrences), so a long window is not dominated by one repeated token; the vector is
// scaled to unit length, so the logits do not grow with the request's size.
#include <cstdint>
#include <string_view>
#include <vector>

namespace slm::router {

struct FeatureOptions {
  uint32_t bucket_bits = 18;  // 2^18 buckets
  bool word_bigrams = true;
  bool word_trigrams = false;
  bool line_shapes = false;
  uint32_t char_min = 3, char_max = 5;  // byte n-gram lengths (char_max 0: none)
  uint32_t max_bytes = 4096;            // only the first max_bytes of a request are read (bounds the latency)
  uint32_t buckets() const { return 1u << bucket_bits; }
};

// Sorted by index, no duplicates.
struct SparseVector {
  std::vector<uint32_t> index;
  std::vector<float> value;
  size_t size() const { return index.size(); }
};

// Throws slm::Error for options out of range (bucket_bits in [4, 26], char_min <= char_max <= 16).
void validate(const FeatureOptions& options);

SparseVector extract_features(std::string_view text, const FeatureOptions& options);

}  // namespace slm::router
