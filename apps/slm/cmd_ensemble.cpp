#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/recipe/ensemble.h"
#include "slm/recipe/report.h"
#include "slm/util/error.h"

namespace slm::cli {

namespace {

struct EnsembleOptions {
  std::string file;
  bool json = false;
  bool strict = false;
};

const char* status_word(ManifestFile::Status s) {
  switch (s) {
    case ManifestFile::Status::ok: return "ok";
    case ManifestFile::Status::no_checksum: return "unchecked";
    case ManifestFile::Status::missing: return "MISSING";
    case ManifestFile::Status::mismatch: return "MISMATCH";
    case ManifestFile::Status::invalid: return "INVALID";
  }
  return "?";
}

// For the error that ends a failed run.
const char* failure_reason(ManifestFile::Status s) {
  switch (s) {
    case ManifestFile::Status::ok: return "ok";
    case ManifestFile::Status::no_checksum: return "no checksum in the manifest";
    case ManifestFile::Status::missing: return "missing";
    case ManifestFile::Status::mismatch: return "checksum mismatch";
    case ManifestFile::Status::invalid: return "invalid";
  }
  return "?";
}

// One line per file, a summary, and an slm::Error (exit status 2) naming every file that failed.
void run_verify(const EnsembleOptions& o) {
  // The manifest alone: a missing recipe is then one failed file among the others, not the end of the run.
  const Ensemble e = read_ensemble_manifest(o.file);
  const auto files = verify_ensemble_files(e);
  std::cout << "ensemble " << e.name << " (" << e.source << "): " << files.size() << " files\n";
  int counts[5] = {};  // by ManifestFile::Status
  std::string failed;
  for (const auto& f : files) {
    ++counts[static_cast<int>(f.status)];
    char size[32] = "-";
    if (f.bytes >= 0) std::snprintf(size, sizeof size, "%.2f MiB", static_cast<double>(f.bytes) / (1 << 20));
    char head[64];
    std::snprintf(head, sizeof head, "%-10s %12s  ", status_word(f.status), size);
    std::cout << head << f.path << " (" << f.role << ")";
    switch (f.status) {
      case ManifestFile::Status::ok:
        if (!f.actual_sha256.empty()) std::cout << ": sha256 " << f.actual_sha256 << " as the manifest says";
        break;
      case ManifestFile::Status::no_checksum:
        std::cout << ": no checksum in the manifest (sha256 " << f.actual_sha256 << ")";
        break;
      case ManifestFile::Status::missing: std::cout << ": no such file"; break;
      case ManifestFile::Status::mismatch:
        std::cout << ": sha256 mismatch: the manifest expects " << f.expected_sha256 << ", the file has "
                  << f.actual_sha256;
        break;
      case ManifestFile::Status::invalid: std::cout << ": " << f.detail; break;
    }
    std::cout << "\n";
    if (verification_failed(f, o.strict))
      failed += std::string(failed.empty() ? "" : ", ") + f.path + " (" + failure_reason(f.status) + ")";
  }
  using S = ManifestFile::Status;
  std::cout << files.size() << " files: " << counts[int(S::ok)] << " ok, " << counts[int(S::mismatch)]
            << " mismatched, " << counts[int(S::missing)] << " missing, " << counts[int(S::invalid)] << " invalid, "
            << counts[int(S::no_checksum)] << " without a checksum"
            << (counts[int(S::no_checksum)] > 0 && !o.strict ? " (allowed; --strict refuses them)" : "") << "\n";
  if (!failed.empty()) throw Error("ensemble verify: " + o.file + ": " + failed);
}

}  // namespace

void add_ensemble_command(CLI::App& app) {
  auto* ens = app.add_subcommand("ensemble",
                                 "Inspect and check ensemble manifests (recipes/ensembles/*.json, "
                                 "models/ensemble.json)");
  ens->require_subcommand(1);
  auto opts = std::make_shared<EnsembleOptions>();
  auto* show = ens->add_subcommand("show",
                                   "Print each specialist's total/active parameters, the sums, weight memory in BF16 "
                                   "and NVFP4, and the training tokens, held-out bpb and checksums the manifest "
                                   "records");
  show->add_option("manifest", opts->file, "ensemble manifest JSON file")->required();
  show->add_flag("--json", opts->json,
                 "print one JSON object (specialists, total, bytes_bf16, bytes_nvfp4, router, checksums)");
  show->callback([opts] {
    Ensemble e = load_ensemble(opts->file);
    if (opts->json) std::cout << ensemble_report_json(e).dump(2) << "\n";
    else std::cout << ensemble_report_text(e);
  });
  auto* verify = ens->add_subcommand(
      "verify",
      "Check the files a manifest names: each checkpoint and the router exist and have the manifest's SHA-256, each "
      "recipe loads, each tokenizer exists; exit status 2 naming the files that fail");
  verify->add_option("manifest", opts->file, "ensemble manifest JSON file")->required();
  verify->add_flag("--strict", opts->strict, "a checkpoint or router without a sha256 in the manifest also fails");
  verify->callback([opts] { run_verify(*opts); });
}

}  // namespace slm::cli
