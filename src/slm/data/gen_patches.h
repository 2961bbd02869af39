#pragma once
// Debug and review documents from the patches Debian applies to upstream sources (debian/patches/*): each patch
// carries a DEP-3 header (https://dep-team.pages.debian.net/deps/dep3/) or a git commit message saying what broke
// and why, and a unified diff with the fix.
//
// A patch whose description or changed lines name a crash, a memory error, undefined behaviour, a race or a build
// failure becomes a debug document (symptom -> diagnosis -> fix); every other patch that changes code becomes a
// review document (the diff, with the description as the reviewer's comment on it). A patch lands in one domain
// only, so the two never hold near-copies of each other.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slm/data/debian_copyright.h"
#include "slm/data/generated.h"

namespace slm::data {

struct ParsedPatch {
  std::string subject;             // the first line of the description
  std::string body;                // the rest of the description (may be empty)
  std::string diff;                // from the first "--- a/... +++ b/..." (or "diff --git", "Index:") to the end
  std::vector<std::string> files;  // the changed files ("+++ b/x" without the "b/"), in order
};

// Splits a patch file into its description and its diff. Header fields other than Description/Subject (Origin,
// Bug, Author, Forwarded, ...), mbox "From <sha>" lines and git's diffstat are dropped.
ParsedPatch parse_patch(const std::string& text);

// "crash", "memory", "undefined-behavior", "concurrency", "build" or "" (not a bug fix), from the description.
std::string classify_patch(const ParsedPatch& p);

struct PatchStats {
  uint64_t packages = 0, patches = 0, no_description = 0, no_code = 0, too_large = 0, license = 0;
  uint64_t debug = 0, review = 0;
  std::map<std::string, uint64_t> categories;
  nlohmann::json to_json() const;
};

struct PatchCorpus {
  std::vector<GeneratedDoc> debug, review;
};

// The patches of every unpacked source package in `package_dirs` (each holds debian/control and debian/patches).
// A patch is taken only when the DEP-5 license of every file it changes is allowed by `licenses`; its documents
// carry the package, the patch path and the license of the first changed file, and split by package, like the
// package's code.
PatchCorpus generate_patch_corpus(const std::vector<std::string>& package_dirs, const LicensePolicy& licenses,
                                  uint64_t max_patch_bytes = 64000, PatchStats* stats = nullptr);

}  // namespace slm::data
