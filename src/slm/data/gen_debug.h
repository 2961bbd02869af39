#pragma once
// The debug corpus: deliberately faulty C++ programs written for it (a catalogue of bug cases with slots for
// names, element types and sizes), compiled with g++ or clang++ and run under the tool that finds the bug
// (AddressSanitizer/LeakSanitizer, UBSan, ThreadSanitizer, valgrind, libstdc++ debug mode, gdb batch backtraces,
// or the compiler/linker itself for broken code). A sample is kept only when the tool's captured output contains
// the report the case plants, and its fix is kept only when it compiles with the same command and runs clean.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "slm/data/generated.h"
#include "slm/util/progress.h"

namespace slm::data {

enum class DebugTool { kSanitizer, kThreadSanitizer, kValgrind, kDebugMode, kGdb, kCompiler, kLinker };

struct BugCase {
  std::string id;     // "heap-buffer-overflow/off-by-one-loop": the program; its variants share a split
  std::string title;  // what goes wrong, in words
  DebugTool tool;
  std::string expect;    // text the tool's report must contain (else the sample is not kept)
  std::string code;      // the faulty program, with ${SLOT} placeholders
  std::string fixed;     // the repaired program ("" when no fix is given)
  std::string fix_note;  // what the fix changes and why
  // Case-specific slot choices (e.g. which header is missing); variant v uses alternatives[v % size].
  std::vector<std::map<std::string, std::string>> alternatives = {};
  bool clang_only = false;  // g++ only warns about this fault
};

const std::vector<BugCase>& bug_catalogue();

struct DebugOptions {
  int variants = 6;  // per case; 0 turns the generator off
  int jobs = 2;
  std::string work_dir = "/tmp";
  double timeout_s = 60;
  size_t max_output_bytes = 8000;  // longer tool output is clipped at a line end, with a note
};

struct DebugSample {
  std::string case_id, file, compiler, command;
  int variant = 0;
  std::string code, output;  // the program and the tool's captured output
  std::string fixed;         // "" unless the fix was verified
  bool reproduced = false;   // the output contains the case's expected report
  bool fix_verified = false;
  std::string fixed_output;  // the fixed program's run (or compile) output
  std::string why_dropped;   // when not reproduced
  std::string text;          // the corpus document
};

// The slot values of one variant (names, types, sizes), chosen deterministically from (case, variant).
std::map<std::string, std::string> debug_slots(const BugCase& c, int variant);
std::string fill_slots(const std::string& templ, const std::map<std::string, std::string>& slots);

// Compiles and runs one variant of one case in a private temp directory.
DebugSample run_bug_case(const BugCase& c, int variant, const DebugOptions& o);

struct DebugStats {
  uint64_t attempted = 0, kept = 0, fixes_verified = 0;
  std::map<std::string, uint64_t> dropped;  // case id -> variants whose report did not reproduce
};

std::vector<GeneratedDoc> generate_debug_corpus(const DebugOptions& o, DebugStats* stats = nullptr,
                                                const ProgressFn& progress = {});

}  // namespace slm::data
