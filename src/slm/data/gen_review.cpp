#include "slm/data/gen_review.h"

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>

#include "slm/data/hashing.h"
#include "slm/data/text.h"
#include "slm/util/error.h"
#include "slm/util/process.h"

namespace slm::data {

namespace fs = std::filesystem;

const char* const kReviewChecks =
    "bugprone-*,performance-*,modernize-use-nullptr,modernize-use-override,modernize-use-using,"
    "modernize-use-emplace,modernize-loop-convert,modernize-use-equals-default,modernize-use-equals-delete,"
    "modernize-redundant-void-arg,modernize-use-bool-literals,readability-container-size-empty,"
    "readability-else-after-return,readability-implicit-bool-conversion,readability-simplify-boolean-expr,"
    "readability-redundant-member-init,readability-make-member-function-const,misc-unused-parameters,"
    "-bugprone-easily-swappable-parameters,-bugprone-reserved-identifier";

std::vector<ReviewRoot> default_review_roots() {
  const std::string gt = "/usr/src/googletest";
  return {
      {gt + "/googletest/src",
       "googletest",
       {"-I" + gt + "/googletest", "-I" + gt + "/googletest/include"},
       {"-all.cc"}},
      {gt + "/googlemock/src",
       "googletest",
       {"-I" + gt + "/googlemock", "-I" + gt + "/googlemock/include", "-I" + gt + "/googletest/include"},
       {"-all.cc"}},
      {"/usr/include/fmt", "libfmt-dev", {}, {}},
      {"/usr/include/spdlog", "libspdlog-dev", {"-DSPDLOG_FMT_EXTERNAL"}, {"/fmt/bundled/"}},
      {"/usr/include/nlohmann", "nlohmann-json3-dev", {}, {}},
      {"/usr/include/CLI", "libcli11-dev", {}, {}},
      {"/usr/include/benchmark", "libbenchmark-dev", {}, {}},
      {"/usr/include/absl/strings", "libabsl-dev", {}, {"/internal/"}},
      {"/usr/include/absl/container", "libabsl-dev", {}, {"/internal/"}},
      {"/usr/lib/llvm-14/include/llvm/ADT", "llvm-14-dev", {"-I/usr/lib/llvm-14/include"}, {}},
      {"/usr/lib/llvm-14/include/llvm/Support", "llvm-14-dev", {"-I/usr/lib/llvm-14/include"}, {"/Windows/"}},
      {"/usr/include/boost/asio", "libboost1.74-dev", {}, {"/impl/", "/detail/"}},
      {"/usr/include/boost/container", "libboost1.74-dev", {}, {"/detail/"}},
      {"/usr/include/boost/property_tree", "libboost1.74-dev", {}, {"/detail/"}},
  };
}

std::vector<Diagnostic> parse_diagnostics(const std::string& output, const std::string& file,
                                          const std::string& shown_path, const std::string& tool) {
  std::vector<Diagnostic> out;
  std::istringstream in(output);
  std::string line;
  static const std::regex head_re(
      R"(^(.+?):(\d+):(\d+): (warning|error|note|style|performance|portability|information): )");
  bool in_block = false;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, head_re)) {
      const bool ours = m[1].str() == file;
      const std::string sev = m[4].str();
      if (sev == "note") {
        // Notes (also those pointing into included headers) belong to the diagnostic before them.
        if (in_block) out.back().text += line + "\n";
        continue;
      }
      in_block = ours && sev != "information";
      if (!in_block) continue;
      Diagnostic d;
      d.tool = tool;
      d.line = std::stoi(m[2].str());
      d.text = line + "\n";
      out.push_back(std::move(d));
    } else if (in_block) {
      out.back().text += line + "\n";
    }
  }
  // The shown path may contain the file name (cppcheck runs on the bare name): replace left to right, once.
  for (auto& d : out) {
    std::string replaced;
    size_t from = 0;
    for (size_t at; (at = d.text.find(file, from)) != std::string::npos; from = at + file.size())
      replaced.append(d.text, from, at - from).append(shown_path);
    d.text = replaced.append(d.text, from, std::string::npos);
  }
  return out;
}

std::vector<DiffHunk> parse_unified_diff(const std::string& diff) {
  std::vector<DiffHunk> hunks;
  std::istringstream in(diff);
  std::string line;
  static const std::regex hunk_re(R"(^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, hunk_re)) {
      DiffHunk h;
      h.old_start = std::stoi(m[1].str());
      h.old_count = m[2].matched ? std::stoi(m[2].str()) : 1;
      h.text = line + "\n";
      hunks.push_back(std::move(h));
    } else if (!hunks.empty() && !line.empty() &&
               (line[0] == ' ' || line[0] == '+' || line[0] == '-' || line[0] == '\\')) {
      hunks.back().text += line + "\n";
    }
  }
  return hunks;
}

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  return lines;
}

bool is_review_source(const std::string& path) {
  static const std::set<std::string> exts = {".h", ".hpp", ".hh", ".cc", ".cpp", ".cxx", ".ipp"};
  return exts.count(fs::path(path).extension().string()) > 0;
}

}  // namespace

std::vector<GeneratedDoc> review_file(const std::string& path, const ReviewRoot& root, const ReviewOptions& o,
                                      ReviewStats* stats) {
  const std::string original = read_file_bytes(path);
  if (!is_clean_text(original)) return {};
  const std::string name = fs::path(path).filename().string();
  const std::string dir = make_temp_dir(o.work_dir, "slm-review-");
  struct Cleanup {
    std::string d;
    ~Cleanup() { remove_dir_tree(d); }
  } cleanup{dir};
  const std::string copy = dir + "/" + name;
  write_text_file(copy, original);

  ProcessOptions po;
  po.timeout_s = o.timeout_s;
  po.cwd = dir;
  po.env = {"LC_ALL=C"};
  // cppcheck first: clang-tidy -fix rewrites the copy.
  const auto cr = run_process(
      {"cppcheck", "--enable=warning,style,performance,portability", "--std=c++17", "--language=c++", "--quiet",
       "--max-configs=1", "--suppress=missingIncludeSystem", "--suppress=missingInclude", "--suppress=unusedFunction",
       "--template={file}:{line}:{column}: {severity}: {message} [{id}]", name},
      po);
  const bool header = fs::path(path).extension().string().starts_with(".h");
  std::vector<std::string> tidy = {"clang-tidy",
                                   "--quiet",
                                   std::string("--checks=") + kReviewChecks,
                                   "-fix",
                                   "-format-style=google",
                                   copy,
                                   "--",
                                   "-x",
                                   "c++",
                                   "-std=c++17",
                                   "-I" + fs::path(path).parent_path().string()};
  if (header) tidy.push_back("-Wno-pragma-once-outside-header");
  for (const auto& a : root.compile_args) tidy.push_back(a);
  const auto tr = run_process(tidy, po);
  if (stats) ++stats->files;
  auto tidy_diags = parse_diagnostics(tr.out, copy, path, "clang-tidy");
  // A file that does not parse with the flags we know gives no trustworthy review: skip it.
  if (tr.timed_out || tr.out.find("[clang-diagnostic-error]") != std::string::npos ||
      tr.err.find("error:") != std::string::npos) {
    if (stats) ++stats->files_unparsable;
    return {};
  }
  auto diags = tidy_diags;
  for (auto& d : parse_diagnostics(cr.err + cr.out, name, path, "cppcheck")) diags.push_back(std::move(d));
  if (diags.empty()) {
    if (stats) ++stats->files_reviewed;
    return {};
  }
  const std::string fixed = read_file_bytes(copy);
  std::vector<DiffHunk> hunks;
  if (fixed != original) {
    const std::string orig_copy = dir + "/orig_" + name;
    write_text_file(orig_copy, original);
    const auto dr = run_process({"diff", "-U2", "--label", "a" + path, "--label", "b" + path, orig_copy, copy}, po);
    hunks = parse_unified_diff(dr.out);
  }

  // Excerpts: diagnostics sorted by line; a new excerpt starts where the gap to the previous one exceeds the
  // context, or where the excerpt would grow past the line limit.
  std::stable_sort(diags.begin(), diags.end(),
                   [](const Diagnostic& a, const Diagnostic& b) { return a.line < b.line; });
  const auto lines = split_lines(original);
  const int nlines = static_cast<int>(lines.size());
  std::vector<GeneratedDoc> docs;
  size_t i = 0;
  while (i < diags.size()) {
    size_t j = i + 1;
    while (j < diags.size() && diags[j].line - diags[j - 1].line <= 2 * o.context_lines &&
           diags[j].line - diags[i].line < o.max_excerpt_lines - 2 * o.context_lines)
      ++j;
    const int from = std::max(1, diags[i].line - o.context_lines);
    const int to = std::min(nlines, diags[j - 1].line + o.context_lines);
    std::string t = "Code review of `" + path + "` (" + root.package + "), lines " + std::to_string(from) + "-" +
                    std::to_string(to) + ":\n\n```cpp\n";
    const int width = static_cast<int>(std::to_string(to).size());
    for (int l = from; l <= to; ++l) {
      std::string num = std::to_string(l);
      t += std::string(static_cast<size_t>(width) - num.size(), ' ') + num + " | " + lines[static_cast<size_t>(l - 1)] +
           "\n";
    }
    t += "```\n";
    for (const char* tool : {"clang-tidy", "cppcheck"}) {
      std::string block;
      for (size_t k = i; k < j; ++k)
        if (diags[k].tool == tool) block += diags[k].text;
      if (block.empty()) continue;
      t += std::string("\n") + (std::string(tool) == "clang-tidy" ? "clang-tidy 14" : "cppcheck 2.10") +
           " says:\n\n```\n" + block + "```\n";
    }
    std::string fix;
    for (const auto& h : hunks) {
      const int h_from = h.old_start, h_to = h.old_start + std::max(h.old_count, 1) - 1;
      if (h_to >= from && h_from <= to) fix += h.text;
    }
    if (!fix.empty())
      t += "\nThe fix clang-tidy applies (`clang-tidy -fix`):\n\n```diff\n--- a" + path + "\n+++ b" + path + "\n" +
           fix + "```\n";
    GeneratedDoc d;
    d.meta = {root.package, path + ":" + std::to_string(from) + "-" + std::to_string(to), "", "review"};
    d.text = std::move(t);
    d.split_key = root.package + "\n" + path;  // every excerpt of a file in one split
    d.extra = {{"diagnostics", j - i}, {"has_fix", !fix.empty()}};
    if (stats) {
      stats->diagnostics += j - i;
      ++stats->documents;
      stats->with_fix += !fix.empty();
    }
    docs.push_back(std::move(d));
    i = j;
  }
  if (stats) ++stats->files_reviewed;
  return docs;
}

std::vector<GeneratedDoc> generate_review_corpus(const ReviewOptions& o, ReviewStats* stats,
                                                 const ProgressFn& progress) {
  if (o.files_per_root <= 0) return {};  // off: e.g. only the source packages' patches are wanted
  for (const char* tool : {"clang-tidy", "cppcheck", "diff"})
    if (!program_available(tool))
      throw Error(std::string("review corpus: ") + tool + " is not installed (scripts/data-deps.sh installs it)");
  const auto roots = o.roots.empty() ? default_review_roots() : o.roots;
  struct Job {
    size_t root;
    std::string path;
  };
  std::vector<Job> jobs;
  for (size_t r = 0; r < roots.size(); ++r) {
    std::vector<std::pair<uint64_t, std::string>> files;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(roots[r].path, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
      const std::string p = it->path().string();
      if (!is_review_source(p)) continue;
      if (std::any_of(roots[r].exclude.begin(), roots[r].exclude.end(),
                      [&](const std::string& x) { return p.find(x) != std::string::npos; }))
        continue;
      const uint64_t size = it->file_size(ec);
      if (ec || size < o.min_file_bytes || size > o.max_file_bytes) continue;
      files.emplace_back(hash64(p, 0x726576696577ULL), p);
    }
    std::sort(files.begin(), files.end());
    for (size_t k = 0; k < files.size() && static_cast<int>(k) < o.files_per_root; ++k)
      jobs.push_back({r, files[k].second});
  }
  std::vector<std::vector<GeneratedDoc>> per_file(jobs.size());
  std::vector<ReviewStats> per_stats(jobs.size());
  std::mutex mu;
  uint64_t done = 0;
  parallel_for(jobs.size(), o.jobs, [&](size_t k) {
    per_file[k] = review_file(jobs[k].path, roots[jobs[k].root], o, &per_stats[k]);
    std::lock_guard<std::mutex> lock(mu);
    if (progress) progress(++done, jobs.size());
  });
  std::vector<GeneratedDoc> docs;
  ReviewStats st;
  for (size_t k = 0; k < jobs.size(); ++k) {
    for (auto& d : per_file[k]) docs.push_back(std::move(d));
    const auto& s = per_stats[k];
    st.files += s.files;
    st.files_reviewed += s.files_reviewed;
    st.files_unparsable += s.files_unparsable;
    st.diagnostics += s.diagnostics;
    st.documents += s.documents;
    st.with_fix += s.with_fix;
  }
  if (stats) *stats = st;
  return docs;
}

}  // namespace slm::data
