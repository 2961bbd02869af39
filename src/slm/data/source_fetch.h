#pragma once
// Fetching Debian source packages into a corpus cache (`slm data fetch`).
//
// apt does the downloading and the verification (each file's SHA-256 against the Sources index, whose InRelease
// is checked against Debian's archive keyring), through a private state directory under the cache: the system's
// sources, lists and locks are never touched, and the only listing read is the one Sources index. Each package is
// unpacked by dpkg-source, pruned to what the corpora read (C++, CMake, shell and documentation files within the
// size limit and whose debian/copyright license the policy allows, plus debian/{control,copyright,changelog} and
// debian/patches), and moved into <cache>/src/<name>_<version> only when complete. <cache>/fetch-state.jsonl records
// every package's outcome, so an interrupted fetch resumes where it stopped and a rejected package is not fetched
// again.
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slm/data/debian_copyright.h"
#include "slm/data/debian_sources.h"

namespace slm::data {

struct FetchOptions {
  std::string cache_dir;
  // The archive. A flat repository (a local test archive) has a suite ending in '/' and no component.
  std::string mirror = "http://deb.debian.org/debian";
  std::string suite = "bookworm";
  std::string component = "main";
  std::string keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";  // "": trusted without a signature
  SelectionRules rules;
  LicensePolicy licenses;
  double rate_mb_s = 4;  // apt's Acquire::http::Dl-Limit; 0 = no limit
  uint64_t max_file_bytes = 1'000'000;
  int attempts = 2;  // per package and run, for network failures
  double timeout_s = 1800;
};

struct PackageOutcome {
  std::string name, version;
  // "ok"; "rejected" (the rules or licenses left too little); "unavailable" (the archive answered 404: not tried
  // again unless asked); "failed" (anything else: tried again by the next run)
  std::string status;
  std::string reason;
  uint64_t download_bytes = 0;
  uint64_t kept_files = 0, kept_bytes = 0, cpp_files = 0;
  uint64_t dropped_license_files = 0, dropped_other_files = 0;
  std::map<std::string, uint64_t> kept_licenses, dropped_licenses;  // files per license short name
  nlohmann::json to_json() const;
  static PackageOutcome from_json(const nlohmann::json& j);
};

struct FetchSummary {
  uint64_t packages = 0, ok = 0, rejected = 0, unavailable = 0, failed = 0;
  uint64_t skipped = 0;  // done by an earlier run
  uint64_t download_bytes = 0, kept_bytes = 0, kept_files = 0, dropped_license_files = 0;
  std::map<std::string, uint64_t> dropped_licenses;
  std::string table() const;  // Markdown
};

class SourceFetcher {
 public:
  explicit SourceFetcher(FetchOptions options);

  // apt-get update on the private state (the Sources index only). Throws slm::Error with apt's message.
  void update_index();
  bool has_index() const;
  // The packages of the downloaded index, highest version per name.
  std::vector<SourcePackage> index() const;
  // The index filtered by the selection rules, as a package list (sorted by name).
  std::vector<ListedPackage> select() const;

  // Fetches, unpacks and prunes every listed package not done yet. progress(done_bytes, total_bytes) counts the
  // listed download sizes; `on_package` sees every outcome as it is recorded.
  FetchSummary fetch(const std::vector<ListedPackage>& packages, bool retry_unavailable = false,
                     const std::function<void(uint64_t, uint64_t)>& progress = {},
                     const std::function<void(const PackageOutcome&)>& on_package = {});

  // Outcomes recorded so far (the last per name and version).
  std::map<std::string, PackageOutcome> recorded() const;
  std::string source_dir() const { return options_.cache_dir + "/src"; }

 private:
  std::vector<std::string> apt_options() const;
  PackageOutcome fetch_one(const ListedPackage& p);
  void prune(const std::string& root, PackageOutcome& out) const;
  FetchOptions options_;
};

}  // namespace slm::data
