#pragma once
// Data cards of a built corpus (`slm data card`): per domain its size by split, where its documents come from (the
// packages and licenses carrying the most bytes), what the build removed (duplicates, contamination; from the
// build's report.json) and one example excerpt from a held-out split.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace slm::data {

struct DataCardOptions {
  std::string corpus_dir;      // slm data build's output: <corpus>/<domain>/{train,validation,test}.jsonl
  size_t top = 8;              // packages and licenses named per domain; the rest are summed
  size_t example_lines = 14;   // the example excerpt: at most this many lines
  size_t example_bytes = 900;  // and this many bytes (cut at a line end)
};

struct DomainCard {
  std::string domain;
  uint64_t documents = 0, bytes = 0;
  std::map<std::string, uint64_t> split_documents, split_bytes;
  uint64_t packages = 0, licenses = 0;                         // distinct
  std::vector<std::pair<std::string, uint64_t>> top_packages;  // by bytes, largest first
  std::vector<std::pair<std::string, uint64_t>> top_licenses;  // by bytes, largest first
  nlohmann::json report;     // the domain's entry of report.json (tokens, duplicates, contamination, generator), if any
  std::string example;       // an excerpt of the first held-out document of at least 3 lines
  std::string example_from;  // "split: package, path (license)"
};

// Domains in report.json's order (those without a report after them, sorted). Throws slm::Error when the directory
// holds no domain.
std::vector<DomainCard> data_cards(const DataCardOptions& options);

std::string data_cards_markdown(const std::vector<DomainCard>& cards);

}  // namespace slm::data
