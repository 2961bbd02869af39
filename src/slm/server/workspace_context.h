#pragma once
// The workspaces `slm serve --workspace DIR` reads (issue 45), as an infill request meets them: which workspace and
// file the request is about, and the context graph at its cursor (workspace/cursor_context.h) merged into its extra
// context after the client's own chunks. docs/serving.md, "The context graph at the cursor".
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "slm/text/infill_prompt.h"
#include "slm/workspace/cursor_context.h"
#include "slm/workspace/workspace.h"

namespace slm::server {

// The server's workspaces, owned by the caller and outliving the server.
using Workspaces = std::vector<workspace::Workspace*>;

struct AddedContext {
  nlohmann::json debug;  // the response's "slm_context"; null when the request met no workspace
  std::string log;       // a note for the request's log line ("" when nothing was added)
};

// The workspace of a request: the one whose root `workspace` names (as given to --workspace or its real path), else
// the one an absolute `filename` lies under, else (a relative filename) the only one, or the first of several that
// holds a file of that path; a request with no filename (llama.vim and llama.vscode send none) gets the only
// workspace's graph with the buffer's path unknown (its "file" is ""). Then the chunks workspace::context_at finds for
// the cursor (prefix + prompt | suffix) are appended to request.extra after the client's chunks, repeats left out.
//
// ApiError 400 naming the field: `workspace` when the server reads none or none with that root; `filename` when it is
// missing or leaves the workspace that `workspace` named. A request without `workspace` whose file lies in no
// workspace gets nothing and no error (a file outside the user's repositories). Never waits for the index: a workspace
// whose first scan is not linked yet adds nothing and says so ("ready": false); a file the index does not hold yet
// wakes its indexing thread.
AddedContext add_workspace_context(const Workspaces& workspaces, const std::string& workspace_field,
                                   text::InfillRequest& request, const workspace::ContextOptions& options = {});

// A chat request's files: each of `files` (our extension; one outside every workspace is a 400 naming files[i], as is
// any when the server reads none) and each `@path` in `text` (the last user message) that names a regular file of a
// workspace (other @words stay text), read from disk (at most the workspace's max_file_bytes), each followed by
// workspace::file_context's chunks: the definitions it calls elsewhere and its headers' outlines. Repeats left out.
std::vector<workspace::ContextChunk> chat_files_context(const Workspaces& workspaces,
                                                        const std::vector<std::string>& files, const std::string& text);
// The block a user message gets before its own text: each chunk as "path:line:" and the text in a fenced block.
std::string chat_context_block(const std::vector<workspace::ContextChunk>& chunks);

}  // namespace slm::server
