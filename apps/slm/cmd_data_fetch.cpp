// slm data fetch: Debian source packages into a corpus cache (docs/data.md).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "slm/data/hashing.h"
#include "slm/data/source_fetch.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/progress.h"

namespace slm::cli {

namespace {

struct FetchFlags {
  std::string cache = "out/debian";
  std::string config = "recipes/data/debian.json";
  std::string packages;    // a package list to fetch instead of the selection
  std::string write_list;  // where the list goes ("" = <cache>/packages.txt)
  bool list_only = false;
  bool refresh = false;
  bool retry_unavailable = false;
  size_t max_packages = 0;
  double max_gb = 0;
  double rate_mb = 4;
  std::string mirror, suite, component;
  bool trusted = false;
};

void run_fetch(const FetchFlags& f) {
  const std::string config_text = read_file(f.config);
  const auto cfg = nlohmann::json::parse(config_text, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) throw Error(f.config + ": not a JSON object");
  if (!cfg.contains("select") || !cfg.contains("licenses"))
    throw Error(f.config + ": needs \"select\" (which packages) and \"licenses\" (which files may enter a corpus)");
  data::FetchOptions o;
  o.cache_dir = f.cache;
  if (cfg.contains("archive")) {
    const auto& a = cfg["archive"];
    o.mirror = a.value("mirror", o.mirror);
    o.suite = a.value("suite", o.suite);
    o.component = a.value("component", o.component);
  }
  if (!f.mirror.empty()) o.mirror = f.mirror;
  if (!f.suite.empty()) o.suite = f.suite;
  if (!f.component.empty()) o.component = f.component == "-" ? "" : f.component;
  if (f.trusted) o.keyring.clear();
  o.rules = data::SelectionRules::from_json(cfg["select"], f.config + ": select");
  o.licenses = data::LicensePolicy::from_json(cfg["licenses"], f.config + ": licenses");
  o.rate_mb_s = f.rate_mb;
  data::SourceFetcher fetcher(o);
  if (f.refresh || !fetcher.has_index()) {
    std::cerr << "slm: reading the Sources index of " << o.mirror << " " << o.suite << " " << o.component << "\n";
    fetcher.update_index();
  }

  std::vector<data::ListedPackage> list;
  if (!f.packages.empty()) {
    list = data::read_package_list(f.packages);
  } else {
    list = fetcher.select();
    const size_t selected = list.size();
    // A cap keeps a spread of the archive, not its first letters: packages are taken in the order of a hash of
    // their names, then listed by name.
    if (f.max_packages || f.max_gb > 0) {
      std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
        return data::hash64(a.name, 0x6465626961ULL) < data::hash64(b.name, 0x6465626961ULL);
      });
      std::vector<data::ListedPackage> kept;
      uint64_t bytes = 0;
      for (const auto& p : list) {
        if (f.max_packages && kept.size() >= f.max_packages) break;
        if (f.max_gb > 0 && bytes + p.bytes > static_cast<uint64_t>(f.max_gb * 1e9)) continue;
        bytes += p.bytes;
        kept.push_back(p);
      }
      list = std::move(kept);
      std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    }
    uint64_t bytes = 0;
    for (const auto& p : list) bytes += p.bytes;
    const std::string out = f.write_list.empty() ? f.cache + "/packages.txt" : f.write_list;
    make_parent_dirs(out);
    write_file_atomic(
        out, data::format_package_list(list, "slm data fetch --config " + f.config + ": " +
                                                 std::to_string(list.size()) + " of " + std::to_string(selected) +
                                                 " selected packages, " + std::to_string(bytes / 1000000) +
                                                 " MB to download\n"
                                                 "NAME VERSION BYTES; fetch exactly these with --packages THIS_FILE"));
    std::cerr << "slm: " << selected << " packages match " << f.config << "; listed " << list.size() << " ("
              << bytes / 1000000 << " MB to download) in " << out << "\n";
  }
  if (f.list_only) return;

  ProgressBar bar(std::cerr, "fetch", 0, "B");
  auto summary = fetcher.fetch(list, f.retry_unavailable, bar.callback(), [&](const data::PackageOutcome& p) {
    if (p.status == "failed") std::cerr << "\nslm: note: " << p.name << " " << p.version << ": " << p.reason << "\n";
  });
  bar.finish();
  std::cout << summary.table();
  std::cout << "unpacked and pruned into " << fetcher.source_dir()
            << "; build the corpora with: slm data build --all --source-dir " << fetcher.source_dir() << " --out DIR\n";
  if (summary.failed)
    std::cerr << "slm: " << summary.failed << " packages failed (listed in " << f.cache
              << "/fetch-state.jsonl); run the same command again to retry them\n";
}

}  // namespace

void add_data_fetch_command(CLI::App* data) {
  static FetchFlags f;
  auto* c = data->add_subcommand(
      "fetch", "Download Debian source packages (apt, private state), keep what the corpora read, license-filtered");
  c->add_option("--cache", f.cache, "cache directory (apt state, unpacked packages, fetch-state.jsonl)")
      ->capture_default_str();
  c->add_option("--config", f.config, "selection rules and license policy (JSON)")->capture_default_str();
  c->add_option("--packages", f.packages, "fetch exactly this package list (NAME VERSION [BYTES] per line)");
  c->add_option("--write-list", f.write_list, "where the selected package list goes (default <cache>/packages.txt)");
  c->add_flag("--list-only", f.list_only, "write the package list and stop");
  c->add_flag("--refresh", f.refresh, "download the Sources index again");
  c->add_flag("--retry-unavailable", f.retry_unavailable, "ask again for packages the archive answered 404 for");
  c->add_option("--max-packages", f.max_packages, "take at most this many selected packages (0 = all)")
      ->capture_default_str();
  c->add_option("--max-gb", f.max_gb, "take selected packages up to this many GB of downloads (0 = all)")
      ->capture_default_str();
  c->add_option("--rate-mb", f.rate_mb, "download limit in MB/s (apt's Acquire::http::Dl-Limit; 0 = none)")
      ->capture_default_str();
  c->add_option("--mirror", f.mirror, "archive URI (default: the config's)");
  c->add_option("--suite", f.suite, "suite (default: the config's; a flat repository's ends in '/')");
  c->add_option("--component", f.component, "component (default: the config's; '-' for a flat repository)");
  c->add_flag("--trusted", f.trusted, "accept an unsigned archive (local test repositories only)");
  c->callback([] { run_fetch(f); });
}

}  // namespace slm::cli
