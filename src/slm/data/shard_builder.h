#pragma once
// Text -> token shards: tokenizes corpus .jsonl files (or plain text files) and writes shards with their
// metadata sidecars. A corpus file <dir>/<domain>/<split>.jsonl becomes <out>/<domain>/<split>-NNNNN.slmtok;
// other inputs become <out>/<name>-NNNNN.slmtok. Each document is stored as BOS + tokens + EOS.
#include <cstdint>
#include <string>
#include <vector>

#include "slm/util/progress.h"

namespace slm::data {

struct ShardBuildOptions {
  std::vector<std::string> inputs;  // corpus directories, .jsonl files, text files or directories
  std::string tokenizer;            // .model
  std::string out_dir;
  std::string name = "data";        // shard prefix for non-corpus inputs
  uint64_t max_shard_tokens = 64ull << 20;
  bool add_bos = true, add_eos = true;
};

struct ShardGroup {
  std::string name;  // "<domain>/<split>" or the prefix
  uint64_t documents = 0, tokens = 0, bytes = 0;
  std::vector<std::string> shards;
};

std::vector<ShardGroup> build_shards(const ShardBuildOptions& options, const ProgressFn& progress = {});

}  // namespace slm::data
