#include "slm/server/workspace_context.h"

#include <sys/stat.h>

#include <climits>
#include <cstdlib>

#include "slm/server/openai.h"

namespace slm::server {

namespace {

using Json = nlohmann::json;

std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

bool is_regular_file(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool graph_holds(const data::LinkedGraph& g, const std::string& rel) {
  for (const auto& f : g.files())
    if (f->path == rel) return true;
  return false;
}

std::string roots(const Workspaces& workspaces) {
  std::string out;
  for (const auto* w : workspaces) out += (out.empty() ? "" : ", ") + w->root();
  return out;
}

}  // namespace

AddedContext add_workspace_context(const Workspaces& workspaces, const std::string& workspace_field,
                                   text::InfillRequest& request, const workspace::ContextOptions& options) {
  AddedContext out;
  workspace::Workspace* ws = nullptr;
  std::string rel, why;
  if (!workspace_field.empty()) {
    if (workspaces.empty())
      throw ApiError(400, "workspace: this server reads no workspace (start it with slm serve --workspace DIR)",
                     "workspace");
    const std::string real = real_path(workspace_field);
    for (auto* w : workspaces)
      if (w->root() == workspace_field || w->root() == real) ws = w;
    if (!ws)
      throw ApiError(
          400, "workspace: '" + workspace_field + "' is not a workspace of this server (" + roots(workspaces) + ")",
          "workspace");
    if (request.filename.empty())
      throw ApiError(400, "filename: required with workspace (the file's path in the workspace)", "filename");
    rel = ws->relative(request.filename, &why);
    if (rel.empty()) throw ApiError(400, "filename: " + why, "filename");
  } else {
    if (workspaces.empty() || request.filename.empty()) return out;
    if (request.filename[0] == '/') {
      for (auto* w : workspaces)
        if (!ws && !(rel = w->relative(request.filename)).empty()) ws = w;
    } else if (workspaces.size() == 1) {
      ws = workspaces[0];
      rel = ws->relative(request.filename);
    } else {
      for (auto* w : workspaces) {
        if (ws) break;
        const std::string r = w->relative(request.filename);
        if (!r.empty() && is_regular_file(w->root() + "/" + r)) ws = w, rel = r;
      }
    }
    if (!ws || rel.empty()) return out;
  }

  out.debug = {{"workspace", ws->root()}, {"file", rel}};
  const auto graph = ws->graph();
  out.debug["ready"] = graph != nullptr;
  if (!graph) {
    out.debug["chunks"] = Json::array();
    out.log = " context: workspace " + ws->root() + " not indexed yet";
    return out;
  }
  if (!graph_holds(*graph, rel)) ws->poke();  // a new file, or one the index has not reached: look again now
  const workspace::CursorContext ctx =
      workspace::context_at(*graph, rel, request.prefix + request.prompt, request.suffix, options);
  size_t duplicates = 0;
  const size_t client = request.extra.size();
  std::vector<bool> kept;
  request.extra = workspace::merge_chunks(request.extra, ctx.chunks, &duplicates, &kept);
  Json chunks = Json::array();  // the chunks added, as the prompt holds them (oldest first)
  std::string names;
  for (size_t i = 0; i < ctx.chunks.size(); ++i) {
    if (!kept[i]) continue;
    const auto& c = ctx.chunks[i];
    chunks.push_back({{"kind", workspace::chunk_kind_name(c.kind)},
                      {"name", c.name},
                      {"filename", c.chunk.filename},
                      {"line", c.line},
                      {"bytes", c.chunk.text.size()}});
    names += std::string(names.empty() ? "" : ", ") + workspace::chunk_kind_name(c.kind) + " " + c.name;
  }
  out.debug["function"] = ctx.function;
  out.debug["chunks"] = chunks;
  out.debug["client_chunks"] = client;
  out.debug["duplicates"] = duplicates;
  out.log = " context: " + rel + (ctx.function.empty() ? " (no function at the cursor)" : " in " + ctx.function) +
            ": " + std::to_string(chunks.size()) + " chunk(s) added" + (names.empty() ? "" : " (" + names + ")") +
            (duplicates ? ", " + std::to_string(duplicates) + " repeat(s) left out" : "");
  return out;
}

}  // namespace slm::server
