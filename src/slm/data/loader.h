#pragma once
// Training windows from token shards: batches of (B, T+1) token windows drawn from one or more sources (a
// domain each, with a mixing weight), deterministic for a seed and exactly resumable from a cursor.
//
// The stream: global sample i picks its source from hash(seed, i) and the weights; the k-th sample drawn from a
// source is window perm_e(k mod W) of epoch e = k / W, where W = (tokens - 1) / T non-overlapping windows
// (window w covers tokens [w*T, w*T + T + 1) of the source's token range: its shards concatenated in order, from
// `begin` to `end`) and perm_e is a
// seeded bijection of [0, W), a fresh one per epoch. Rank r of a world of n takes the samples with
// i mod n == r, so the union over ranks is the single-process stream. Nothing depends on the batch size: a
// cursor saved at any batch boundary resumes the same sample stream.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slm/data/shards.h"

namespace slm::data {

struct ShardSource {
  static constexpr uint64_t kToEnd = ~uint64_t{0};
  std::string name;                 // e.g. the domain
  std::vector<std::string> shards;  // files, concatenated in this order
  double weight = 1.0;              // relative sampling weight (> 0)
  // The tokens [begin, end) of the concatenation are read (end is capped at the token count). One set of shards
  // can so serve as two sources, e.g. training tokens and a held-out tail (train/evaluate.h, held_out_start).
  uint64_t begin = 0, end = kToEnd;
};

struct LoaderOptions {
  int64_t batch_size = 8;  // B per rank
  int64_t seq_len = 256;   // T: windows hold T + 1 tokens (inputs and shifted targets)
  uint64_t seed = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  bool verify_checksums = true;
};

// Where the stream stands: samples taken so far (global, all ranks) and per-source draws. Saved with the
// trainer's checkpoint; `fingerprint` ties it to the seed, T and the sources' shards.
struct LoaderCursor {
  uint64_t samples = 0;
  std::vector<uint64_t> drawn;
  uint64_t fingerprint = 0;
  nlohmann::json to_json() const;
  static LoaderCursor from_json(const nlohmann::json& j);
};

struct Batch {
  torch::Tensor tokens;   // (B, T+1) int64
  torch::Tensor doc_ids;  // (B, T+1) int32: 0 for the document holding a row's first token, +1 at each document start
  torch::Tensor source;   // (B) int64: index of the source each row came from
  std::vector<uint64_t> window;  // per row: the window index within its source (for tests and debugging)
  std::vector<uint64_t> sample;  // per row: the global sample index (keys per-sample transforms: data/fim.h)
};

class TokenLoader {
 public:
  TokenLoader(std::vector<ShardSource> sources, LoaderOptions options);

  Batch next();
  LoaderCursor cursor() const;
  // Throws slm::Error when the cursor was saved for another seed, sequence length or shard set.
  void restore(const LoaderCursor& c);

  uint64_t windows(size_t source) const { return sources_.at(source).windows; }
  uint64_t tokens(size_t source) const { return sources_.at(source).total; }  // in the source's token range
  size_t num_sources() const { return sources_.size(); }
  const std::string& source_name(size_t s) const { return sources_.at(s).name; }
  // Window w of source s, without advancing the stream.
  void read_window(size_t s, uint64_t w, int64_t* tokens, int32_t* doc_ids) const;

 private:
  struct Source {
    std::string name;
    double weight = 1.0;
    std::vector<std::shared_ptr<const Shard>> shards;
    std::vector<uint64_t> starts;  // prefix sums of shard token counts
    uint64_t begin = 0;            // first token of the range in the concatenation
    uint64_t total = 0, windows = 0;  // tokens in the range, windows over them
  };
  size_t pick_source(uint64_t sample) const;
  uint64_t permuted(size_t s, uint64_t k) const;

  std::vector<Source> sources_;
  std::vector<double> cumulative_;
  LoaderOptions opt_;
  uint64_t fingerprint_ = 0;
  uint64_t samples_ = 0;
  std::vector<uint64_t> drawn_;
};

// A seeded bijection of [0, n): rounds of xorshift and odd multiply on the enclosing power of two, with cycle
// walking back into range. Exposed for tests.
uint64_t permute_index(uint64_t x, uint64_t n, uint64_t key);

}  // namespace slm::data
