#include "slm/server/workspace_context.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>

#include "slm/server/openai.h"
#include "slm/util/files.h"

namespace slm::server {

namespace {

using Json = nlohmann::json;

bool is_regular_file(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
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
    if (workspaces.empty()) return out;
    if (request.filename.empty()) {
      // llama.vim and llama.vscode name no current file: with one workspace the buffer counts as a file of it whose
      // path is unknown (its own functions are known from the window; the graph gives the rest).
      if (workspaces.size() != 1) return out;
      ws = workspaces[0];
    } else if (request.filename[0] == '/') {
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
    if (!ws || (rel.empty() && !request.filename.empty())) return out;
  }

  out.debug = {{"workspace", ws->root()}, {"file", rel}};
  const auto graph = ws->graph();
  const auto cmake = ws->cmake();
  out.debug["ready"] = graph != nullptr;
  if (!graph || !cmake) {
    out.debug["chunks"] = Json::array();
    out.log = " context: workspace " + ws->root() + " not indexed yet";
    return out;
  }
  const std::string before = request.prefix + request.prompt;
  workspace::CursorContext ctx;
  if (!rel.empty() && workspace::is_cmake_name(rel)) {  // a CMakeLists.txt or .cmake file: the CMake index's context
    if (!cmake->holds(rel)) ws->poke();
    ctx = cmake->context_at(rel, before, request.suffix, options);
  } else {
    if (!rel.empty() && !graph->file(rel)) ws->poke();  // a new file, or one not reached yet: look again now
    ctx = workspace::context_at(*graph, rel, before, request.suffix, options);
  }
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
  out.log = " context: " + (rel.empty() ? "the unnamed buffer" : rel) +
            (ctx.function.empty() ? " (no function at the cursor)" : " in " + ctx.function) + ": " +
            std::to_string(chunks.size()) + " chunk(s) added" + (names.empty() ? "" : " (" + names + ")") +
            (duplicates ? ", " + std::to_string(duplicates) + " repeat(s) left out" : "");
  return out;
}

std::vector<workspace::ContextChunk> chat_files_context(const Workspaces& workspaces,
                                                        const std::vector<std::string>& files,
                                                        const std::string& text) {
  struct Named {
    workspace::Workspace* ws;
    std::string rel;
  };
  std::vector<Named> named;
  // The workspace and path of a name, if it is a regular file of one (a relative name: the first that holds it).
  auto locate = [&](const std::string& name, std::string* why) -> std::optional<Named> {
    for (auto* w : workspaces) {
      const std::string rel = w->relative(name, why);
      if (!rel.empty() && is_regular_file(w->root() + "/" + rel)) return Named{w, rel};
      if (!rel.empty() && why) *why = "no such file in the workspace " + w->root();
    }
    return std::nullopt;
  };
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = "files[" + std::to_string(i) + "]";
    if (workspaces.empty())
      throw ApiError(400, where + ": this server reads no workspace (start it with slm serve --workspace DIR)", where);
    std::string why = "not in a workspace of this server (" + roots(workspaces) + ")";
    const auto n = locate(files[i], &why);
    if (!n) throw ApiError(400, where + ": " + files[i] + ": " + why, where);
    named.push_back(*n);
  }
  // @path mentions: '@' at the start or after a space, then the path up to the next space or closing punctuation.
  for (size_t at = text.find('@'); at != std::string::npos; at = text.find('@', at + 1)) {
    if (at > 0 && !std::isspace(static_cast<unsigned char>(text[at - 1])) && text[at - 1] != '(') continue;
    size_t end = at + 1;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) && text[end] != ')' &&
           text[end] != ',' && text[end] != '`')
      ++end;
    std::string name = text.substr(at + 1, end - at - 1);
    while (!name.empty() && (name.back() == '.' || name.back() == ':' || name.back() == '?' || name.back() == '!'))
      name.pop_back();
    if (name.empty()) continue;
    if (const auto n = locate(name, nullptr)) named.push_back(*n);
  }
  std::vector<workspace::ContextChunk> out;
  for (const auto& n : named) {
    const auto graph = n.ws->graph();
    std::ifstream in(n.ws->root() + "/" + n.rel, std::ios::binary);
    std::string body(std::istreambuf_iterator<char>(in), {});
    if (body.size() > n.ws->limits().max_file_bytes) body.resize(n.ws->limits().max_file_bytes);
    std::vector<workspace::ContextChunk> chunks;
    if (graph) {
      chunks = workspace::file_context(*graph, n.rel, body);
    } else {  // not indexed yet: the file alone
      chunks.push_back({{n.rel, body}, workspace::ChunkKind::kFile, n.rel, 1});
    }
    for (auto& c : chunks)
      if (std::none_of(out.begin(), out.end(), [&](const workspace::ContextChunk& k) {
            return k.chunk.filename == c.chunk.filename && k.chunk.text == c.chunk.text;
          }))
        out.push_back(std::move(c));
  }
  return out;
}

std::string chat_context_block(const std::vector<workspace::ContextChunk>& chunks) {
  std::string out = "Files of my workspace:\n";
  for (const auto& c : chunks) {
    out += "\n" + c.chunk.filename + (c.line > 1 ? ":" + std::to_string(c.line) : "") + ":\n```\n" + c.chunk.text;
    if (!c.chunk.text.empty() && c.chunk.text.back() != '\n') out += "\n";
    out += "```\n";
  }
  return out + "\n";
}

}  // namespace slm::server
