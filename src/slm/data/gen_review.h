#pragma once
// The review corpus: clang-tidy and cppcheck run on real C++ from installed packages. clang-tidy runs with -fix on
// a private copy of each file, so every suggested change is a real diff; the diagnostics are grouped into excerpts
// (nearby lines together), and each excerpt becomes one document: the numbered code, the diagnostics on it, and
// the part of the fix diff that touches it.
#include <cstdint>
#include <string>
#include <vector>

#include "slm/data/generated.h"
#include "slm/util/progress.h"

namespace slm::data {

struct ReviewRoot {
  std::string path;
  std::string package;
  std::vector<std::string> compile_args;  // include paths and defines the files need to parse
  std::vector<std::string> exclude;       // path substrings to skip
};

std::vector<ReviewRoot> default_review_roots();

// The clang-tidy checks: bug patterns, performance and the modernize/readability checks that carry fixes;
// the two that fire on nearly every line of library code (reserved identifiers, swappable parameters) are off.
extern const char* const kReviewChecks;

struct ReviewOptions {
  std::vector<ReviewRoot> roots;  // empty: default_review_roots()
  int files_per_root = 8;         // chosen by a hash of the path: the same files on every machine; 0: off
  uint64_t min_file_bytes = 1500, max_file_bytes = 60000;
  int jobs = 2;
  std::string work_dir = "/tmp";
  double timeout_s = 120;
  int context_lines = 4;  // around the diagnostics of an excerpt
  int max_excerpt_lines = 60;
};

struct Diagnostic {
  std::string tool;  // clang-tidy | cppcheck
  int line = 0;
  std::string text;  // the diagnostic with its notes and caret lines, paths as in the package
};

// Parses "FILE:LINE:COL: severity: message" blocks of `output` that refer to `file` (continuation lines and
// notes stay with their diagnostic); `shown_path` replaces `file` in the text.
std::vector<Diagnostic> parse_diagnostics(const std::string& output, const std::string& file,
                                          const std::string& shown_path, const std::string& tool);

struct DiffHunk {
  int old_start = 0, old_count = 0;
  std::string text;  // "@@ ... @@" and its lines
};
std::vector<DiffHunk> parse_unified_diff(const std::string& diff);

struct ReviewStats {
  uint64_t files = 0, files_reviewed = 0, files_unparsable = 0, diagnostics = 0, documents = 0, with_fix = 0;
};

// Reviews one file (a copy is made; the original is never touched).
std::vector<GeneratedDoc> review_file(const std::string& path, const ReviewRoot& root, const ReviewOptions& o,
                                      ReviewStats* stats = nullptr);

std::vector<GeneratedDoc> generate_review_corpus(const ReviewOptions& o, ReviewStats* stats = nullptr,
                                                 const ProgressFn& progress = {});

}  // namespace slm::data
