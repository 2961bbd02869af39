#pragma once
// Compile-pass on held-out code (issue 18, `slm eval compile-pass`): C++ source files are cut at function bodies,
// the model completes each body from everything above it, and a completion passes when the file, with that body in
// place of the original, still compiles (g++ -fsyntax-only with the file's own directory on the quote path). The
// cuts are MultiPL-E-shaped problems, so the HumanEval harness (humaneval.h, with CompileOptions::syntax_only)
// generates, judges and reports them: pass@1 is the compile-pass rate.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "slm/eval/humaneval.h"
#include "slm/eval/problems.h"

namespace slm::eval {

struct BodyCutOptions {
  size_t max_per_file = 2;       // cuts kept per file (spread over its definitions by a hash of their names)
  size_t min_body_lines = 2;     // bodies shorter than this (in lines) are not worth completing
  size_t max_body_bytes = 2000;  // nor are longer ones, which a small model's completion budget cannot reach
};

// A problem cut from a file and the body it replaced: program_text(problem, body) is the file again.
struct BodyCut {
  Problem problem;
  std::string body;
};

// A definition's text split at its body: text[0, head_end) runs through the line of the opening '{' (which must end
// that line), body is what lies between that line and the line of the closing '}' (which must start it), and the
// closing line starts at close_line; stop = "\n" + that line's indentation + "}", which body does not contain.
// nullopt for a definition without such a body (= default, one-line bodies, a function-try block) or one outside the
// options' line and byte limits. Comments, string and character literals are skipped when matching braces.
struct BodySplit {
  size_t head_end = 0, close_line = 0;
  std::string body, stop;
};
std::optional<BodySplit> split_body(const std::string& definition, const BodyCutOptions& options);

// The function definitions of one file (tree-sitter, data/callgraph.h) whose body opens with a '{' that ends its line
// and closes with a '}' that starts one: prompt = the file through the opening line; tests = the closing line and
// the rest of the file; stop token = "\n" + the closing line's indentation + "}". name (the problem's prefix) is the
// file's name in reports; dir goes to Problem::quote_dirs. Deterministic.
std::vector<BodyCut> cut_function_bodies(const std::string& name, const std::string& text, const std::string& dir,
                                         const BodyCutOptions& options = {});

// Every C++ source file (.cc .cpp .cxx .c++ .C) under root, sorted, at most max_files of them (0: all), cut; names
// are relative to root, quote directories absolute. Throws slm::Error when root is missing or holds no source file.
std::vector<BodyCut> cut_source_tree(const std::string& root, size_t max_files, const BodyCutOptions& options = {});

// The control: the cuts whose original body compiles with the judge (a file that does not compile on its own, e.g.
// for a missing dependency, says nothing about a model). progress (optional) sees each judged cut.
std::vector<BodyCut> keep_compiling(std::vector<BodyCut> cuts, Judge& judge, int jobs,
                                    const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace slm::eval
