#pragma once
// Packs: token shards moved to the GPU machine, which reaches no registry and takes at most 64 MiB per call.
//
// `slm data pack` groups a shard directory's files (each .slmtok with its .slmtok.json sidecar) into files of at most
// `max_pack_bytes`, each member compressed as its own xz stream (liblzma) and checksummed (SHA-256 of its bytes).
// Compressed token ids carry more tokens per MiB than compressed text on our corpora (bench/RESULTS.md "Packs") and
// need no tokenizer on the GPU machine. `slm train --data X.slmpack` unpacks a pack once into X.slmpack.d (every
// member verified) and trains on that directory; a run that spans several GPU calls resumes with the next pack.
//
// File layout: "SLMPACK1", the header length (u64, little-endian), the header (JSON: format, kind, tokens,
// members with name, bytes, packed, offset, sha256), then the members' xz streams (offsets from the header's end).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "slm/util/progress.h"

namespace slm::data {

struct PackMember {
  std::string name;  // path relative to the shard directory, '/'-separated
  uint64_t bytes = 0, packed = 0, offset = 0;
  std::string sha256;  // of the uncompressed bytes
};

struct PackHeader {
  std::string path;
  uint64_t tokens = 0;
  uint64_t data_offset = 0;  // where the first member starts in the file
  std::vector<PackMember> members;
  std::string header_sha256;  // identifies the pack's content (the header names every member's checksum)
};

struct PackOptions {
  std::string shard_dir;
  std::string out_dir;
  std::string name = "pack";              // <out>/<name>-NNNNN.slmpack
  uint64_t max_pack_bytes = 60ull << 20;  // a call carries 64 MiB in all
  uint32_t preset = 6;                    // xz preset (0-9)
  int jobs = 2;                           // members compressed at once
};

struct PackSummary {
  std::string file, sha256;
  uint64_t bytes = 0, raw_bytes = 0, tokens = 0;
  std::vector<std::string> members;
};

// Writes the packs and <out>/packs.json (the list with every pack's SHA-256). progress(raw bytes done, total).
// Throws slm::Error when a shard alone compresses past the limit (the message says how to make smaller shards).
std::vector<PackSummary> write_packs(const PackOptions& options, const ProgressFn& progress = {});

// Reads and checks a pack's header (magic, JSON, member names and offsets within the file).
PackHeader read_pack_header(const std::string& path);

// Unpacks every member into dest_dir, verifying sizes and SHA-256; writes dest_dir/.slmpack (the header's hash).
void extract_pack(const std::string& path, const std::string& dest_dir);

// slm train's --data: a directory is returned as is; a .slmpack is unpacked once into "<pack>.d" (reused when its
// marker names the same pack; safe when several processes of one run race) and that directory is returned.
std::string resolve_training_data(const std::string& data, std::ostream& log);

// xz, as used in packs (exposed for tests and the benchmark).
std::string xz_compress(const std::string& bytes, uint32_t preset);
std::string xz_decompress(const std::string& packed, uint64_t expected_bytes, const std::string& what);

}  // namespace slm::data
