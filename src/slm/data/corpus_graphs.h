#pragma once
// Context-graph documents from a built corpus (`slm data graphs --corpus`): the product's training format for C++
// (docs/context-graphs.md) over the same files as the whole-file cpp domain, so they inherit its deduplication,
// decontamination, license filter and split. Each package's files of one split are laid out as a source tree and
// parsed into one call graph; its documents go to <shards>/<domain>/<split>-NNNNN.slmtok (domain "cpp-graphs"), a
// domain of their own so that a run sets the mix of whole files and graphs with `slm train --mix`.
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "slm/data/graph_docs.h"

namespace slm::data {

struct CorpusGraphOptions {
  std::string corpus_dir;  // slm data build's output: <corpus>/cpp/{train,validation,test}.jsonl
  std::string shards_dir;
  std::string tokenizer;
  std::string domain = "cpp-graphs";
  GraphDocOptions docs;
  std::string work_dir = "/tmp";  // each package's tree is written here while it is parsed
  uint64_t max_shard_tokens = 64ull << 20;
  double package_parse_budget_s = 120;  // per package (CallGraphOptions::time_budget_s); 0 = no limit
};

struct CorpusGraphReport {
  uint64_t packages = 0, files = 0, functions = 0, edges = 0;
  uint64_t files_skipped = 0;  // not parsed: too large, not text, the parser's time limit or the package's budget
  GraphDocStats docs;
  std::map<std::string, uint64_t> split_documents, split_tokens;
  uint64_t whole_file_tokens = 0;  // the cpp domain's own tokens, for the mix
};

// progress(package index, packages seen so far) as packages finish.
CorpusGraphReport build_corpus_graphs(const CorpusGraphOptions& options,
                                      const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace slm::data
