#pragma once
// Ensemble manifests: the specialists of a lineup, each with its domain, recipe and, for serving, its checkpoint,
// tokenizer and the router labels it answers; plus the router's model file. Paths are relative to the manifest's
// directory. Every serving field is optional, so manifests written before them still read (docs/serving.md).
// A shipped lineup (models/ensemble.json) also records each file's SHA-256 and how its specialist was trained;
// verify_ensemble_files checks the files against them, default_ensemble_path finds that manifest.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "slm/recipe/accounting.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm {

struct Specialist {
  std::string name;
  std::string domain;
  std::string recipe_path;          // resolved against the manifest's directory
  std::string checkpoint;           // weights file or checkpoint directory (BF16/FP32 or NVFP4); empty until trained
  std::string sha256;               // of the checkpoint file: 64 lowercase hex digits; empty: none given
  std::string tokenizer;            // the code tokenizer .model it was trained with; empty: none given
  std::vector<std::string> routes;  // router labels this specialist answers (default: its name)
  std::optional<long long> training_tokens;  // tokens its training run read
  std::optional<double> heldout_bpb;         // bits per byte on its domain's held-out split
  double target_total = 0;                   // the size the product documents state for it (0 = none)
  double target_active = 0;
  Recipe recipe;
  Accounting accounting;
};

struct Ensemble {
  std::string source;
  std::string name;
  std::string description;
  std::string router;         // router model file (slm router train); empty: none
  std::string router_sha256;  // of the router file; empty: none given
  std::vector<Specialist> specialists;
  long long total = 0, active = 0, stored = 0, bytes_bf16 = 0, bytes_nvfp4 = 0;
};

// The manifest with every recipe loaded and accounted. Throws slm::Error naming the file and field for a malformed
// manifest, and the recipe's file for a missing or invalid recipe.
Ensemble load_ensemble(const std::string& path);
// The manifest's own fields only (recipe, accounting and the sums stay empty): what `slm ensemble verify` needs
// to report a missing recipe among the other files instead of stopping at it.
Ensemble read_ensemble_manifest(const std::string& path);

// One file a manifest names, as verify_ensemble_files found it.
struct ManifestFile {
  enum class Status {
    ok,           // present; its SHA-256 equals the manifest's (or, for recipes and tokenizers, it reads)
    no_checksum,  // present, but the manifest gives no SHA-256 for it
    missing,      // no such file
    mismatch,     // its SHA-256 differs from the manifest's
    invalid,      // present but unusable (a directory where a checksummed file belongs, a recipe that fails to load)
  };
  std::string role;  // "weights of cpp", "router", "recipe of cpp, cmake", "tokenizer of cpp"
  std::string path;
  Status status = Status::ok;
  long long bytes = -1;                        // its size; -1 when missing
  std::string expected_sha256, actual_sha256;  // the manifest's (empty: none) and the file's (checkpoints, router)
  std::string detail;                          // invalid: why
};

// Every file of the manifest (from read_ensemble_manifest or load_ensemble): each specialist's checkpoint and the
// router, hashed and compared with the manifest's sha256 / router_sha256; each distinct recipe (it must load) and
// tokenizer (it must exist), listed once with the specialists that use it. Never throws for a bad file: that is
// the file's status.
std::vector<ManifestFile> verify_ensemble_files(const Ensemble& e);
// Whether this file fails verification; a file without a checksum fails only when strict.
bool verification_failed(const ManifestFile& f, bool strict);

// Where the shipped lineup's manifest, models/ensemble.json, is looked for, in this order: under the working
// directory cwd, then under the parent of the executable's directory (the program is built as build/slm, so that
// is the repository root wherever it is run from).
std::vector<std::string> default_ensemble_candidates(const std::filesystem::path& executable,
                                                     const std::filesystem::path& cwd);
// The first candidate that is a file, or "" when there is none.
std::string default_ensemble_path(const std::filesystem::path& executable, const std::filesystem::path& cwd);
// The same for this process (/proc/self/exe and the current directory).
std::string default_ensemble_path();
// For the commands' errors when default_ensemble_path() is "": which paths were tried.
std::string default_ensemble_missing_note();

}  // namespace slm
