#pragma once
// OpenAI's answers to POST /v1/chat/completions and /v1/completions as a ResponseFormat (openai.h has the JSON):
// server-sent events ending in `data: [DONE]`, the first chat chunk carrying the role, the usage chunk on request.
#include <memory>
#include <string>

#include "slm/server/openai.h"
#include "slm/server/response_format.h"
#include "slm/server/workspace_context.h"

namespace slm::server {

std::unique_ptr<ResponseFormat> openai_format(bool chat, bool include_usage);

// The plan of an OpenAI generation request (parse_generation_request + prepare_generation). A chat request that
// names files of the workspaces (`files`, `@path`: chat_files_context) gets them before its last user message's text,
// as many chunks as leave the completion the room it had without them (the router reads the question alone); the log
// note names them.
GenerationPlan openai_plan(const Specialists& specialists, const std::string& body, bool chat,
                           int64_t default_max_tokens, const Workspaces& workspaces = {});

}  // namespace slm::server
