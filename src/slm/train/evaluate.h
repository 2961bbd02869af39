#pragma once
// Held-out evaluation, shared by the trainer's validation and `slm eval`: the mean next-token loss and the bits per
// byte of a model per domain, over a split of the token shards; and the one reading of a shard directory both use.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slm/data/loader.h"
#include "slm/data/tokenizer.h"
#include "slm/model/hybrid_lm.h"

namespace slm::train {

struct DomainScore {
  double loss = 0;            // mean negative log-likelihood per target token, in nats
  double bpb = std::nan("");  // sum NLL / ln 2 / sum of the target tokens' bytes (NaN without token bytes)
  int64_t tokens = 0;         // target tokens scored
  double bytes = 0;           // bytes those tokens decode to
  int64_t batches = 0;        // micro-batches scored (pooled: their sum over the domains)
  // Per window (one sequence of a scored batch), in order: its NLL sum and its bytes (empty when pooled); with
  // EvalWindows::keep_tokens also its input ids. The windows are the same for every model, so a router can pick a
  // model per window (the routed column of slm eval domains).
  std::vector<double> window_nll, window_bytes;
  std::vector<std::vector<int64_t>> window_tokens;
};

struct EvalWindows {
  int64_t batch = 8;         // sequences per micro-batch
  int64_t seq_len = 0;       // input tokens per sequence (each window holds seq_len + 1)
  int64_t batches = 4;       // micro-batches per domain; fewer when the split has fewer windows
  bool keep_tokens = false;  // fill DomainScore::window_tokens
};

// A shard directory holds either layout, or both (docs/training.md, "Data"):
//   <data>/<domain>/<split>-NNNNN.slmtok   slm data build + slm data shard: a domain per directory, with its splits
//   <data>/<prefix>-NNNNN.slmtok           slm data shard of plain files: one domain named after the prefix (e.g.
//                                          "data"), all of it training data
// A domain with training shards but no validation shards gets a held-out tail of them as its validation split.
struct DomainShards {
  std::string name;
  std::map<std::string, std::vector<std::string>> splits;  // split name -> shard files in order
};

// The domains of data_dir (those named that exist, or all when `domains` is empty), in the order given (or by
// name). Throws slm::Error when data_dir is not a directory, or when a directory and a plain prefix share a name.
std::vector<DomainShards> find_domains(const std::string& data_dir, const std::vector<std::string>& domains);

// Where the held-out validation tail of training shards begins, as a token offset into their concatenation: it
// holds at least max(1% of the tokens, window_tokens) and starts at a document boundary, the last one that leaves
// that much, unless that would hold out more than twice as much (a long last document): then it starts exactly that
// many tokens before the end. 0 when the tokens cannot make a training window and a validation window each.
uint64_t held_out_start(const std::vector<std::string>& train_shards, uint64_t window_tokens);

// One source per domain of find_domains that has the split (weight 1). Without validation shards, "train" is the
// training shards up to held_out_start and "validation" the rest; window_tokens is one window (seq_len + 1).
std::vector<data::ShardSource> split_sources(const std::string& data_dir, const std::string& split,
                                             const std::vector<std::string>& domains, uint64_t window_tokens);

// The tokenizer the shard records in its sidecar, as tokenizer/<name> when that file is readable (relative to the
// working directory, like the repository's tokenizer/); "" otherwise.
std::string shard_tokenizer(const std::string& shard_path);

// The tokenizer a training run was trained with, as `slm eval` and `slm generate` look it up: the run
// configuration's `tokenizer` (slm train --tokenizer; "none" is returned as is), else the one the first shard of
// `split` under data_dir names (shard_tokenizer; a held-out validation split is read from the training shards),
// else "" (also when data_dir has no such shards).
std::string run_tokenizer(const nlohmann::json& run_config, const std::string& data_dir, const std::string& split);

// The tokenizer a checkpoint (directory or weights file) was trained with, as `slm generate` and `slm eval humaneval`
// look it up: run_tokenizer of the run configuration in the meta.json beside the weights; "" when there is none,
// when it is unknown, or "none" (then the byte-level tokenizer).
std::string checkpoint_tokenizer(const std::string& checkpoint);

// [vocab_size] float64: the bytes each id decodes to (0 for ids past the tokenizer's vocabulary and for specials).
torch::Tensor token_byte_counts(const data::Tokenizer& tok, int64_t vocab_size);

// Scores the model on each source: the same windows every call (the seed-0 window stream of data::TokenLoader, the
// first `batches` micro-batches), the loss computed in float64 on `device`. token_bytes (from token_byte_counts)
// may be undefined: bpb is then NaN. The model runs in eval mode and is left in the mode it was in.
std::map<std::string, DomainScore> evaluate_model(model::HybridLM& model, const std::vector<data::ShardSource>& sources,
                                                  const EvalWindows& windows, const torch::Tensor& token_bytes,
                                                  torch::Device device);

// Every domain's tokens together: total NLL over total tokens, and over total bytes.
DomainScore pooled(const std::map<std::string, DomainScore>& scores);

// `slm eval`: a checkpoint scored on a split of the shards.
struct CheckpointEval {
  std::string checkpoint;  // training checkpoint directory, run directory (its latest), or weights file (NVFP4 too)
  std::string recipe;      // recipe file: required for a weights file; overrides a training checkpoint's recipe
  std::string data;        // shard directory ("": the training run's)
  std::string split = "validation";
  std::vector<std::string> domains;             // empty: the run's domains, else every domain with the split
  std::string tokenizer;                        // for bpb; "": the run's, else the one the shards name; "none": no bpb
  int64_t batch = 0, seq_len = 0, batches = 0;  // 0: the run's settings, else 8, the recipe's seq_len, 4
  std::string device = "cpu";
  bool bf16 = false;         // forward under BF16 autocast (as training on a GPU computes), weights as loaded
  bool keep_tokens = false;  // EvalWindows::keep_tokens
};

struct CheckpointScores {
  std::string weights;        // the weights file read
  std::string recipe;         // the recipe's name
  int64_t step = -1;          // training step (-1 for a weights file)
  EvalWindows windows;        // as used: batches is the most micro-batches any domain scored (each has its own count)
  std::string tokenizer;      // "" without bpb
  int64_t nvfp4_weights = 0;  // weights the model runs in NVFP4
  bool bf16 = false;          // computed under BF16 autocast
  std::map<std::string, DomainScore> domains;
  DomainScore all;  // pooled()
};

// Builds the recipe's model, loads the checkpoint (a training checkpoint is checksum-verified) and scores it with
// evaluate_model. Throws slm::Error naming the file, tensor, domain or split at fault.
CheckpointScores evaluate_checkpoint(const CheckpointEval& request);

}  // namespace slm::train
