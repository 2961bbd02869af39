#pragma once
// Rotary position embedding (RoPE) as the attention layers, MLA and the DSA indexer apply it, with its cos/sin
// tables kept per device and dtype.
#include <torch/types.h>

#include <mutex>
#include <utility>
#include <vector>

#include "slm/model/decode_state.h"
#include "slm/model/documents.h"

namespace slm::model {

// Where the RoPE angles of a block of T tokens come from: positions start..start+T-1 in every row (a cached sequence,
// or unpacked training rows), or, with packed documents, each token's place in its document, ids [B or 1, T] (int64).
// Every position is below end.
struct RotaryPositions {
  int64_t start = 0;
  torch::Tensor ids;  // undefined: the run from start
  int64_t end = 0;
};
// The rotary positions of h [B, T, ...]: each token's place in its document with packed documents, else the cached
// length onward (a cache holds one sequence per row; documents come only without a cache).
RotaryPositions positions(const torch::Tensor& h, const TokenCache* cache, const Documents* docs);

// RoPE of x [B, T, heads, dim]: the first and second halves of the head dim form the (real, imaginary) pairs,
// frequency theta^(-2i/dim) for pair i. cos and sin of the angles are tabulated per (device, dtype) for every
// position below a bound that grows by doubling, so a decode step rotates with a slice of the tables instead of
// recomputing them. The angles are formed in float64 (float32 loses ~1e-3 rad of phase at positions near 1e5) and
// cos/sin cast to the dtype, exactly as a direct computation at those positions would.
class Rope {
 public:
  Rope(int64_t dim, double theta);
  torch::Tensor operator()(const torch::Tensor& x, const RotaryPositions& pos) const;
  // cos and sin [rows, dim / 2] for positions 0..rows-1 (rows >= n), in dtype on device: the tables rotation reads.
  std::pair<torch::Tensor, torch::Tensor> tables(const torch::Device& device, torch::ScalarType dtype, int64_t n) const;

 private:
  struct Table {
    torch::Device device;
    torch::ScalarType dtype;
    torch::Tensor cos, sin;
  };
  int64_t half_;
  double theta_;
  // The tables grow inside const calls, which several threads may make at once on one model.
  mutable std::mutex mutex_;
  mutable std::vector<Table> tables_;
};

}  // namespace slm::model
