#pragma once
// The context graph at the cursor (issue 45): what of a workspace's call graph an infill prompt gets beside the text
// around the cursor, in the repository-level layout the models train on (text/infill_prompt.h: a file separator and
// the path before each chunk).
//
// The text the editor sent (the window: prefix, the cursor's line, suffix) is parsed on its own under the file's path,
// so an unsaved edit counts at once: the function around the cursor is the innermost definition of the window that
// holds the cursor's line (when the window starts inside a definition whose head it cut off, the lines of it before
// the window come from the graph's copy of the file), and its calls are resolved against the workspace's graph with
// the graph's rules (data/callgraph.h LinkedGraph::resolve_calls). Outside every function only the include outlines
// come. The chunks, by rank:
//   callee  the definition of each function it calls (not those the window itself holds), in call order;
//   class   the definition of the class it is a method of, when the window does not hold it;
//   caller  for each function that calls it (the graph's, from the files on disk), the lines around its first call;
//   include for each header of the workspace it (or the graph's copy of the file) includes, its first lines.
// Each chunk is cut to max_chunk_lines lines; the whole to max_chunks chunks and max_bytes bytes, lowest rank left out
// first. They are returned oldest first, lowest rank first, as the infill prompt wants them: its budget drops the first
// chunks first and the most useful ones sit nearest the cursor.
#include <cstdint>
#include <string>
#include <vector>

#include "slm/data/callgraph.h"
#include "slm/text/infill_prompt.h"

namespace slm::workspace {

struct ContextOptions {
  size_t max_chunks = 16;       // llama.vim's ring_n_chunks
  size_t max_chunk_lines = 64;  // llama.vim's ring_chunk_size
  size_t max_bytes = 16'384;
  size_t max_callers = 4;
  size_t max_includes = 2;
};

enum class ChunkKind { kInclude, kCaller, kClass, kTarget, kCallee, kFile };
const char* chunk_kind_name(ChunkKind kind);  // "include", "caller", "class", "target", "callee", "file"

struct ContextChunk {
  text::InfillChunk chunk;  // filename: the path relative to the workspace
  ChunkKind kind = ChunkKind::kCallee;
  std::string name;   // what it shows: "geo::area", "geo::Circle", "geo/shapes.h"
  uint32_t line = 0;  // where the chunk's text starts in its file
};

struct CursorContext {
  std::string function;              // qualified name of the function around the cursor ("" when none)
  std::vector<ContextChunk> chunks;  // oldest first (see above)
};

// `before` is the text before the cursor (input_prefix + prompt), `after` the text after it (input_suffix), `path`
// the file's path relative to the workspace.
CursorContext context_at(const data::LinkedGraph& graph, const std::string& path, const std::string& before,
                         const std::string& after, const ContextOptions& options = {});

// A whole file named in a chat message (`@path`, or the request's `files`): the file (its first 4 x max_chunk_lines
// lines), then the definitions its functions call in other files of the workspace, in the order of its calls, then
// the outlines of the workspace headers it includes; best first, within max_chunks and max_bytes.
std::vector<ContextChunk> file_context(const data::LinkedGraph& graph, const std::string& path, const std::string& text,
                                       const ContextOptions& options = {});

// Shared with the CMake index (cmake_index.h): lines [first, first + n) of text (0-based, whole lines); the first
// chunks of `ranked` (best first) that fit max_chunks and max_bytes, returned oldest first as the prompt wants them
// (by kind from include up to callee, and within a kind the best last).
std::string line_range(const std::string& text, size_t first, size_t n);
std::vector<ContextChunk> budget_oldest_first(std::vector<ContextChunk> ranked, const ContextOptions& options);

// The client's chunks (input_extra, oldest first) followed by ours, without repeats: a client chunk equal to an
// earlier one and a chunk of ours whose text a client chunk already holds are left out, counted in *duplicates;
// (*ours_kept)[i] tells whether ours[i] went in.
std::vector<text::InfillChunk> merge_chunks(const std::vector<text::InfillChunk>& client,
                                            const std::vector<ContextChunk>& ours, size_t* duplicates = nullptr,
                                            std::vector<bool>* ours_kept = nullptr);

}  // namespace slm::workspace
