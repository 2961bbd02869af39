#pragma once
// Domain corpora from local sources (Debian packages on this machine; docs/data.md has what each domain draws on):
// collect files per domain, attach package/path/license/domain, drop binary and oversized files, remove exact
// and near duplicates within and across domains, remove documents that overlap the evaluation problems, split
// train/validation/test by a hash of the source file, and write <out>/<domain>/<split>.jsonl plus report.json.
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slm/data/debian_copyright.h"
#include "slm/data/dedup.h"
#include "slm/data/gen_debug.h"
#include "slm/data/gen_review.h"
#include "slm/data/gen_router.h"

namespace slm::data {

// Where one domain's documents come from. With `all_files`, every clean text file under `path` is taken;
// otherwise the domain's file classifier decides (C++ extensions, CMakeLists/.cmake, shell scripts).
struct SourceRoot {
  std::string path;
  std::string package;  // the owning Debian package when known (else looked up in dpkg's file lists)
  std::string license;  // empty: read /usr/share/doc/<package>/copyright
  bool all_files = false;
  std::vector<std::string> exclude;  // path substrings to skip (generated code, ...)
  std::string format;                // "" text as is (or by extension: .html converted, .gz unpacked); "man": roff
};

// The built-in roots of a file-based domain (cpp, cmake, shell, design, algorithm), whether or not they exist on
// this machine; generated domains (debug, review, orchestration) have none.
std::vector<SourceRoot> default_roots(const std::string& domain);
const std::vector<std::string>& implemented_domains();
// Does the domain's classifier take this file? (head: its first bytes, for shebangs.)
// algorithm: the files of the algorithm libraries named in default_roots("algorithm"), which the cpp and design
// roots exclude (algorithm_paths()), so every file has one domain.
bool domain_accepts(const std::string& domain, const std::string& path, std::string_view head);
const std::vector<std::string>& algorithm_paths();

struct CorpusOptions {
  std::vector<std::string> domains;
  std::string out_dir;
  std::map<std::string, std::vector<SourceRoot>> roots;  // per domain; empty: default_roots
  uint64_t max_bytes_per_domain = 0;  // 0: no cap; else sample files by a hash of their path down to the cap
  uint64_t max_file_bytes = 1'000'000;
  uint64_t min_file_bytes = 32;
  double validation_fraction = 0.01;
  double test_fraction = 0.01;
  uint64_t split_seed = 0;
  std::string eval_jsonl;  // problems to decontaminate against ("" = none)
  int decontam_ngram = 13;
  MinHashOptions minhash;
  std::string tokenizer;  // optional .model: count tokens per domain
  std::string dpkg_info_dir = "/var/lib/dpkg/info";
  std::string doc_dir = "/usr/share/doc";
  int jobs = 2;  // threads for document conversion and the generators
  // Generated domains. Debug and review have few sources (51 bug programs; a few dozen reviewed files), so their
  // held-out fractions are larger than the file-based domains'; all documents of one source share its split.
  DebugOptions debug;
  double generated_held_out = 0.1;  // validation and test fraction each, for debug and review
  ReviewOptions review;
  RouterOptions router;
  // Unpacked Debian source packages (slm data fetch): their debian/patches add debug and review documents
  // (gen_patches.h), taken when `patch_licenses` allows the license of every file a patch changes.
  std::vector<std::string> source_packages;
  LicensePolicy patch_licenses;
};

struct DomainSummary {
  std::string domain;
  uint64_t candidates = 0, dropped_unclean = 0, dropped_size = 0;
  uint64_t exact_dups = 0, near_dups = 0, cross_domain_dups = 0, contaminated = 0;
  uint64_t documents = 0, bytes = 0, tokens = 0;
  std::map<std::string, uint64_t> split_docs, split_bytes, split_tokens;
  nlohmann::json generator = nlohmann::json::object();  // the generator's own counts (debug, review, orchestration)
  std::vector<std::string> missing_roots;
};

struct CorpusReport {
  std::vector<DomainSummary> domains;
  nlohmann::json removed = nlohmann::json::array();  // every duplicate and contaminated document, with the reason
  nlohmann::json to_json() const;
  std::string table() const;  // the per-domain summary table (Markdown)
};

// Phase name, done, total.
using CorpusProgress = std::function<void(const std::string& phase, uint64_t done, uint64_t total)>;

CorpusReport build_corpus(const CorpusOptions& options, const CorpusProgress& progress = {});

// "train", "validation" or "test" for a source file, by a hash of package + path (build_corpus passes the path below
// the file's root, so that a corpus splits alike wherever its sources lie).
std::string split_of(const std::string& package, const std::string& path, double validation, double test,
                     uint64_t seed);

}  // namespace slm::data
