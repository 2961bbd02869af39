#pragma once
// llama.cpp's server API where editors use it (docs/serving.md, "Editors"): POST /infill as llama.vim and
// llama.vscode send it, POST /completion as Continue's llama.cpp provider sends it, POST /tokenize, POST /detokenize,
// GET /props; and the infill prompt of OpenAI's
// /v1/completions with `suffix`. Parsing with per-field errors (ApiError 400 naming the field), the specialist of the
// file's type, the prompt in SPM order within the budget, and the response JSON. No HTTP here.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "slm/engine/engine.h"
#include "slm/server/response_format.h"
#include "slm/server/specialists.h"
#include "slm/server/workspace_context.h"
#include "slm/text/infill_prompt.h"

namespace slm::server {

// The fields /infill and /completion share (llama.cpp's params_from_json_cmpl).
struct LlamaParams {
  std::string model;
  int64_t n_predict = -1;  // -1: up to the room the context leaves; 0: warm-up (fills the cache, answers "")
  std::vector<std::string> stop;
  int64_t n_indent = 0;
  int64_t t_max_predict_ms = 0;  // 0: none
  engine::Sampling sampling;     // llama.cpp's defaults where the request gives none, with its samplers applied
  bool random_seed = true;       // seed absent or -1: a fresh one per request, as llama.cpp
  bool stream = false, cache_prompt = true;
  std::vector<std::string> response_fields;
  std::vector<std::string> samplers;  // as given (llama.cpp's default chain when absent)
};

struct InfillParams : LlamaParams {
  text::InfillRequest infill;  // input_extra, input_prefix, prompt, input_suffix; filename (our extension)
  std::string workspace;       // our extension: the root of the server's workspace the file is in (workspace_context.h)
};

// POST /completion's prompt: a string, a list of token ids, or a list mixing strings and ids (llama.cpp's "mixed"
// prompt: each string tokenized, BOS before the first element when it is a string). Control tokens written as
// text ("<|user|>") stay text here (llama.cpp parses them): a prompt cannot forge one.
struct CompletionParams : LlamaParams {
  nlohmann::json prompt;  // a string or an array, checked
};

// Throws ApiError (400, naming the field) for malformed JSON, wrong types, values out of range and values this
// server cannot honour (n_probs > 0, an unknown sampler, grammar, json_schema, lora, mirostat, n_cmpl > 4).
InfillParams parse_infill_request(const std::string& body);
// The same fields and refusals for /completion, with `prompt` required (one prompt: a list of several strings, which
// llama.cpp answers with a list, is refused).
CompletionParams parse_completion_request(const std::string& body);

// The specialist that answers an editor's request: the one named by model; else the one of the file's type (the
// file name from filename, or model taken as one, else guessed from the text: file_type.h); else the router's pick
// (or the only specialist). Throws ApiError 404 when none fits.
Specialist& infill_specialist(const Specialists& specialists, const std::string& model, const std::string& filename,
                              const std::string& text, nlohmann::json& routing);

// The prompt of a fill-in-the-middle request for sp's tokenizer in SPM order (the one trained), within budget tokens,
// with cache points at the end of the extra context and at the start of the cursor's line. Throws ApiError 400 when
// the tokenizer has no FIM tokens.
text::InfillPrompt infill_prompt_for(const Specialist& sp, const text::InfillRequest& request, int64_t budget);
// Where the engine keeps prefix states for this prompt: after the extra context (context_end) and before the
// cursor's line (the token that begins the part of the prefix after its last newline), the points that stay the
// same from keystroke to keystroke.
std::vector<int64_t> infill_cache_points(const Specialist& sp, const text::InfillPrompt& prompt);

// POST /infill: the specialist as infill_specialist picks it, the context graph at the cursor when the file is in
// one of the workspaces (its chunks after the client's input_extra; the response's "slm_context" and the log say
// which), the prompt within the context left by n_predict, and llama.cpp's answer.
GenerationPlan infill_plan(const Specialists& specialists, const std::string& body, int64_t default_max_tokens,
                           const Workspaces& workspaces = {});
// The specialist as for /infill (named, the text's file type, else the router), the prompt's ids (ids outside the
// tokenizer's vocabulary: 400), and llama.cpp's answer: the response JSON and stream of /infill, with "prompt".
GenerationPlan completion_plan(const Specialists& specialists, const std::string& body, int64_t default_max_tokens);

// llama.cpp's json_get_nested_values: only the named fields, each keyed by its flattened name ("timings/prompt_n");
// names that lead nowhere are left out.
nlohmann::json select_fields(const nlohmann::json& full, const std::vector<std::string>& fields);

// POST /tokenize {content, add_special, with_pieces, model?}, POST /detokenize {tokens, model?}, GET /props.
nlohmann::json tokenize_json(const Specialists& specialists, const std::string& body);
nlohmann::json detokenize_json(const Specialists& specialists, const std::string& body);
nlohmann::json props_json(const Specialists& specialists, int64_t default_max_tokens);

}  // namespace slm::server
