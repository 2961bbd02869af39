#pragma once
// What `slm chat` talks to: specialists loaded in this process, or a running `slm serve` over HTTP (streaming
// /v1/chat/completions). Both stream the answer's text as it is produced and say which specialist answered.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slm/server/specialists.h"
#include "slm/server/workspace_context.h"
#include "slm/text/chat_template.h"

namespace slm::server {

struct ChatOptions {
  std::string model = "auto";
  int64_t max_tokens = 256;
  double temperature = 0.7;
  double top_p = 1.0;
  uint64_t seed = 0;
};

struct ChatReply {
  std::string specialist, text, finish_reason;
  std::string context;  // in-process: the workspace files put before the question (" context: ..."), "" when none
};

class ChatBackend {
 public:
  virtual ~ChatBackend() = default;
  // Sends the conversation and streams the assistant's answer to on_text. Throws slm::Error with the server's
  // message for a refused request or a connection that fails.
  virtual ChatReply send(const std::vector<text::ChatMessage>& history, const ChatOptions& options,
                         const std::function<void(const std::string&)>& on_text) = 0;
};

// The specialists (and workspaces) must outlive the backend. A message naming a file of a workspace (`@path`) gets
// the file and its context graph before the question, as from `slm serve --workspace` (workspace_context.h).
std::unique_ptr<ChatBackend> in_process_chat(Specialists& specialists, Workspaces workspaces = {});
// url: http://host:port (no TLS). api_key: sent as a bearer token when non-empty.
std::unique_ptr<ChatBackend> http_chat(const std::string& url, const std::string& api_key);

}  // namespace slm::server
