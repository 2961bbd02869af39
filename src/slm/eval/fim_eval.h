#pragma once
// `slm eval fim` (issue 44): code completion at a cursor, measured as an editor user sees it, on held-out files of a
// corpus (slm data build's <corpus>/<domain>/<split>.jsonl; a file's split is a hash of its package and path, so
// no held-out file was trained on).
//
// Cases, deterministic for a seed:
//   line: the cursor right after the indentation of a code line (not blank, not a comment-only line, at least
//         min_line_chars after the indentation); prefix = the text before the cursor, suffix = the text from the
//         line's end (its '\n') on, truth = the rest of the line.
//   body: the cursor at column 0 of a function body's first line, after a '{' that ends its line; truth = the body
//         up to the line of its matching '}'. The bodies are compile-pass's (compile_pass.h cut_function_bodies:
//         tree-sitter finds the definitions, braces are matched with comments, string, character and raw-string
//         literals skipped), so a body case can be compiled in place: the file with the prediction as the body.
// Prompts: text::build_infill_prompt in SPM order within the model's context, with extra context per mode:
//   none:       the current file only;
//   neighbours: llama.vim-style chunks of other files: the first chunk_lines lines of each other held-out file of
//               the same package, by path, at most max_chunks of them;
//   graph:      the context graph at the cursor as `slm serve --workspace` gives it (workspace/cursor_context.h) with
//               the package's held-out files as the workspace: the definitions the function around the cursor calls,
//               its class, its callers' call sites and its included headers' outlines, found from the window
//               without the text to predict (so that text's own calls cannot choose them), each chunk after its path.
// The infill prompt keeps extra chunks only when the tokenizer has <|file_sep|> (infill_prompt.h).
// Metrics: exact match of the first line (trailing whitespace ignored), edit similarity 1 - Levenshtein / max length
// over Unicode code points, and for body cases the share with which the file compiles (g++ -fsyntax-only).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slm/data/callgraph.h"
#include "slm/data/tokenizer.h"
#include "slm/eval/compile_pass.h"
#include "slm/eval/humaneval.h"
#include "slm/model/hybrid_lm.h"
#include "slm/text/infill_prompt.h"

namespace slm::eval {

struct HeldOutFile {
  std::string package, path, text;
};

// The records of <corpus>/<domain>/<split>.jsonl whose path is a C++ file (data/callgraph.h is_cpp_source_name),
// in file order. Throws slm::Error naming the file for a missing split or a malformed line.
std::vector<HeldOutFile> read_held_out(const std::string& corpus, const std::string& domain, const std::string& split);

enum class FimKind { kLine, kBody };
const char* fim_kind_name(FimKind kind);  // "line" / "body"

struct FimCase {
  FimKind kind = FimKind::kLine;
  size_t file = 0;                     // index into the files the cases were made from
  size_t line = 0;                     // 1-based line of the cursor
  size_t cursor = 0;                   // byte offset of the cursor in the file
  std::string prefix, prompt, suffix;  // the text before the cursor's line, that line up to the cursor, after it
  std::string truth;
  std::string name;  // "path:line"
  Problem problem;   // body cases: prompt + body + "\n" + tests is the file (program_text), for the compiler
};

struct FimCaseOptions {
  size_t line_cases = 200, body_cases = 50;  // at most this many of each kind (0: none of that kind)
  size_t lines_per_file = 4;                 // line cases per file before the overall cap
  size_t min_line_chars = 4;                 // shorter lines (after the indentation) are no line case
  uint64_t seed = 0;                         // picks the lines of each file and the cases kept under the caps
  BodyCutOptions cut{1, 2, 2000};            // body cases per file, minimum lines, maximum bytes
};

// Every line case of one file (all candidates, in line order); file is the index stored in each case.
std::vector<FimCase> line_cases(const std::string& path, const std::string& text, size_t file, size_t min_line_chars);
// The body cases of one file (compile_pass.h cut_function_bodies with the options' cut), quote_dir for #include "".
std::vector<FimCase> body_cases(const std::string& path, const std::string& text, size_t file,
                                const BodyCutOptions& cut, const std::string& quote_dir);
// The cases of all files: per file up to lines_per_file line cases picked by a seeded hash, then each kind capped
// by the same hash over all files; ordered by file and line.
std::vector<FimCase> make_fim_cases(const std::vector<HeldOutFile>& files, const FimCaseOptions& options);

// The "copy the line above" baseline: the last non-blank line of text (the text before the cursor, the cursor's own
// line excluded) after its indentation; "" when there is none.
std::string copy_line_above(const std::string& prefix);

// Levenshtein distance over Unicode code points (an invalid UTF-8 byte counts as one), and 1 - distance / the
// longer one's length (1 for two empty texts).
size_t levenshtein(const std::string& a, const std::string& b);
double edit_similarity(const std::string& a, const std::string& b);
// The first lines of both, trailing whitespace removed, are equal.
bool first_line_match(const std::string& prediction, const std::string& truth);

// What a model's raw output predicts: a line case its first line; a body case the text before the stop
// ("\n" + indentation + "}") or, without one, up to its end less trailing newlines.
std::string fim_prediction(const FimCase& c, const std::string& generated);

enum class FimContext { kNone, kNeighbours, kGraph };
const char* fim_context_name(FimContext mode);                        // "none", "neighbours", "graph"
std::vector<FimContext> parse_fim_contexts(const std::string& list);  // "none,neighbours,graph"; throws slm::Error

struct FimContextOptions {
  size_t chunk_lines = 64;  // llama.vim's ring_chunk_size
  size_t max_chunks = 16;   // llama.vim's ring_n_chunks
};

// The extra chunks of one case and mode over the same files. Graph mode parses each package once (on first use).
class FimContextSource {
 public:
  FimContextSource(const std::vector<HeldOutFile>& files, FimContextOptions options);
  ~FimContextSource();
  std::vector<text::InfillChunk> chunks(const FimCase& c, FimContext mode);
  // The linked call graph of a package's held-out files (parsed on first use).
  const data::LinkedGraph& graph(const std::string& package);

 private:
  const std::vector<HeldOutFile>& files_;
  FimContextOptions options_;
  std::map<std::string, std::unique_ptr<data::LinkedGraph>> graphs_;  // package -> its linked call graph
};

// A model to complete with; tokenizer must have the FIM specials.
struct FimModel {
  std::string name, description;
  std::shared_ptr<model::HybridLM> model;
  std::shared_ptr<data::Tokenizer> tokenizer;
};

struct FimGenerateOptions {
  int64_t line_tokens = 48, body_tokens = 256;  // the generation caps of each kind
  int64_t context = 0;                          // the prompt and the generation together (0: the recipe's seq_len)
};

// One case's prompt statistics and generated text (greedy, EOS ends it; a line case also stops at its first
// newline, a body case at its stop sequence).
struct FimGeneration {
  std::string text;
  int64_t prompt_tokens = 0, extra_kept = 0, extra_dropped = 0;
  bool truncated = false;
};
FimGeneration fim_generate(const FimModel& m, const text::InfillRequest& request, const FimCase& c,
                           const FimGenerateOptions& options);

// The control of the compile check: the body cases whose original body compiles with the judge (a file that does
// not compile on its own, e.g. for a header of its project missing here, says nothing about a model); line cases
// stay. progress sees each judged body.
std::vector<FimCase> keep_compiling_bodies(std::vector<FimCase> cases, Judge& judge, int jobs,
                                           const std::function<void(size_t done, size_t total)>& progress = {});

// Scores of one (source, context mode, kind).
struct FimScore {
  std::string source, context;  // the copy baseline's context is "-"
  FimKind kind = FimKind::kLine;
  size_t cases = 0, exact = 0;
  double similarity = 0;  // summed; mean = similarity / cases
  size_t compiled = 0, compile_judged = 0;
  double prompt_tokens = 0, extra_kept = 0, extra_dropped = 0;  // summed over the cases (models only)
  size_t truncated = 0;
  // Workspace use (issue 45): predictions that call a function the package defines (name then '(', the context
  // adherence rule of context_adherence.h), and the identifiers they use that neither the package's files nor the
  // standard library hold (invented).
  size_t workspace_calls = 0;
  uint64_t identifiers = 0, invented = 0;
  double exact_match() const { return cases ? static_cast<double>(exact) / static_cast<double>(cases) : 0; }
  double mean_similarity() const { return cases ? similarity / static_cast<double>(cases) : 0; }
};

// The text around the cursor as an editor sends it: the whole lines before the cursor's line within prefix_chars
// characters, the cursor's line, and suffix_lines lines after the cursor (llama.vim sends n_prefix and n_suffix lines);
// 0: all of that side. The graph mode's context is found from the same window, as the server finds it.
struct FimWindow {
  size_t prefix_chars = 0, suffix_lines = 0;
};
// The case with its prefix and suffix cut to the window.
FimCase fim_window(const FimCase& c, const FimWindow& window);

struct FimRunOptions {
  std::vector<FimContext> contexts = {FimContext::kNone, FimContext::kNeighbours, FimContext::kGraph};
  FimWindow window;  // the whole file by default
  FimContextOptions context;
  FimGenerateOptions generate;
  Judge* judge = nullptr;    // body cases are compiled with it; null: no compile check
  // The standard library's identifiers (KnownIdentifiers::standard_library), known beside the package's own when
  // counting invented identifiers; null: only the package's.
  const std::set<std::string>* standard_identifiers = nullptr;
  int jobs = 1;              // compiles in parallel
  std::string results_path;  // every prediction as JSONL ("": none)
};

struct FimReport {
  std::string corpus, domain, split;
  size_t files = 0, line_cases = 0, body_cases = 0, body_candidates = 0;  // candidates: before the compile control
  size_t line_truth_workspace_calls = 0, body_truth_workspace_calls = 0;  // truths that call a package function
  std::vector<FimScore> scores;
  std::vector<std::string> sources;  // descriptions, one per source in score order
  nlohmann::json json() const;
  std::string markdown() const;
};

// Scores the copy-line-above baseline and every model in every context mode on the cases; progress sees each
// prediction.
FimReport run_fim(const std::vector<HeldOutFile>& files, const std::vector<FimCase>& cases,
                  const std::vector<FimModel>& models, const FimRunOptions& options,
                  const std::function<void(size_t done, size_t total)>& progress = {});

// Latency through the HTTP API, as llama.vim asks (issue 44): per held-out file, its first line case sent to
// `POST /infill` cold (the file's first request), then `warm` more with the cursor moved on by step_chars characters
// of the truth each (the user typing the line); the wall time of each whole request, and the server's tokens_cached and
// timings.prompt_n.
struct FimLatencyOptions {
  std::string url;    // http://HOST:PORT of `slm serve`
  std::string model;  // the request's "model" ("" as llama.vim sends by default: the server's choice)
  std::string api_key;
  FimWindow window{1500, 64};  // input_prefix and input_suffix (64: llama.vim's n_suffix)
  int64_t n_predict = 48;
  size_t warm = 3, step_chars = 4;
  size_t max_files = 20;  // cold requests at most
  double timeout_s = 300;
};

// The body llama.vim's s:fim sends (autoload/llama.vim: its defaults, as tests/server/test_infill.cpp records it)
// while the user writes the case's line: prompt = the indentation and the first `typed` characters of the truth,
// input_suffix = what follows the line (the truth itself is never sent).
nlohmann::json llama_vim_request(const FimCase& c, size_t typed, const FimLatencyOptions& options);

// The nearest-rank percentile (p in (0, 100]) of values; 0 for none.
double percentile(std::vector<double> values, double p);

struct FimLatency {
  std::string url;
  std::vector<double> cold_ms, warm_ms;
  double cold_cached = 0, cold_prompt_n = 0, warm_cached = 0, warm_prompt_n = 0;  // summed
  nlohmann::json json() const;
  std::string markdown() const;
};

// Throws slm::Error for a server that does not answer or answers an error (its message).
FimLatency measure_fim_latency(const std::vector<FimCase>& cases, const FimLatencyOptions& options,
                               const std::function<void(size_t done, size_t total)>& progress = {});

// <dir>/fim.png (gnuplot data and script beside it): exact match and edit similarity per source and mode; returns
// its path.
std::string plot_fim(const FimReport& report, const std::string& dir);

}  // namespace slm::eval
