#pragma once
// Text documents on disk: plain files, directory trees and corpus .jsonl files (one JSON object per line with
// "text" and the DocumentMeta fields), read one document at a time.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "slm/data/shards.h"

namespace slm::data {

struct TextDocument {
  std::string id;  // stable identity: the file path, or "<jsonl path>:<line>"
  std::string text;
  uint64_t raw_bytes = 0;  // bytes this document took in its input (for progress)
  DocumentMeta meta;       // from the .jsonl record; for plain files only `path` is set
};

// Leading and trailing ASCII white space removed.
std::string_view trim_space(std::string_view s);
// ASCII letters in lower case, other bytes as they are.
std::string ascii_lower(std::string_view s);
// The first n bytes of a file ("" when it cannot be read): enough to see a shebang.
std::string file_head(const std::string& path, size_t n);

// Valid UTF-8 without NUL bytes: what the corpora keep (binary and mis-encoded files are dropped).
bool is_clean_text(std::string_view text);
bool is_valid_utf8(std::string_view text);

// Total bytes of the inputs (file sizes; directories recursively).
uint64_t text_input_bytes(const std::vector<std::string>& inputs);

// Calls fn for every document of the inputs, in a deterministic order (directories sorted). Files larger than
// max_file_bytes are skipped. Throws slm::Error for a missing input or a malformed .jsonl line.
void for_each_text_document(const std::vector<std::string>& inputs, const std::function<void(const TextDocument&)>& fn,
                            uint64_t max_file_bytes = 8'000'000);

std::string read_file_bytes(const std::string& path);

// One corpus record as a JSON line (text + metadata).
std::string corpus_record(const std::string& text, const DocumentMeta& meta);

}  // namespace slm::data
