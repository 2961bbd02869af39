#pragma once
// Levenshtein distance (unit-cost insertions, deletions and substitutions) between two sequences of any element
// type, in O(|a| |b|) time and O(|b|) memory: over bytes for the recipe reader's "did you mean" hints, over Unicode
// code points for the completion evaluation's edit similarity.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace slm {

template <class Seq>
size_t edit_distance(const Seq& a, const Seq& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace slm
