#pragma once
// The prompt of a fill-in-the-middle request (an editor's completion at the cursor: llama.cpp's /infill, OpenAI's
// completions with `suffix`, Ollama's generate with `suffix`), in the layouts the training data uses (data/fim.h):
//
//   PSM:  <|bos|> E <|fim_prefix|> P <|fim_suffix|> S <|fim_middle|>          the model writes the middle
//   SPM:  <|bos|> E <|fim_prefix|> <|fim_suffix|> S <|fim_middle|> P          the model continues P with the middle
//   E:    (<|file_sep|> "path\ntext")* <|file_sep|> "path\n"                   the extra chunks, then the current file
//
// P is the text before the cursor (input_prefix followed by prompt, the cursor's line up to the cursor, encoded as
// one text as training encodes a prefix), S the text after it. SPM is the paper's variant 2, the one we train: the
// text that changes while the user types (P's end) is the prompt's end, so a cache keeps everything before it. It
// is not llama.cpp's --spm-infill order (<SUF> S <PRE> P <MID>). E is the repository-level layout (Qwen2.5-Coder,
// arXiv 2409.12186, which llama.cpp's format_prompt_infill follows): each chunk of another file is introduced by the
// file separator and its path; without a file-separator token in the vocabulary the extra chunks are left out
// (reported in extra_dropped), since text separators the model never saw in training would only be noise.
//
// The budget (max_tokens: the prompt's share of the context, i.e. the context less the tokens to generate). Our
// choice, documented against llama.cpp's: llama.cpp takes prefix:suffix 3:1 of one batch (n_batch), the rest of the
// context goes to the newest extra chunks, cut at a token inside the oldest chunk that fits. Here the text around the
// cursor comes first and the extra chunks get what is left, so an over-long request is trimmed in this order:
//   1. the oldest extra chunks, whole chunks only (a chunk cut in its middle would lose its path header, and the
//      kept chunks stay the same from keystroke to keystroke, which keeps the cached state after them valid);
//   2. when P and S together still do not fit: S may keep a quarter of the room (3:1 as llama.cpp), P the rest,
//      either side taking what the other does not need; P loses its far end (its start) and S its far end (its
//      end), by whole lines (a cut that moves only when a line is dropped, not at every keystroke) — a single line
//      longer than its share is cut by tokens. The suffix then gets whatever the prefix's line cut left unused.
// The <|bos|>, the sentinels and the current file's header (given a file separator, and a path or kept extra chunks)
// are always there: a budget below them yields just them.
// A request is never refused for its length; `truncated` says that something was left out for the budget.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "slm/data/tokenizer.h"

namespace slm::text {

struct InfillChunk {
  std::string filename, text;
};

struct InfillRequest {
  std::vector<InfillChunk> extra;  // chunks of other files, oldest first (llama.vim's ring buffer order)
  std::string prefix;              // the text before the cursor's line (input_prefix)
  std::string prompt;              // the cursor's line up to the cursor (llama.cpp's prompt of /infill)
  std::string suffix;              // the text after the cursor (input_suffix)
  std::string filename;            // the current file's path ("": not known)
};

enum class InfillOrder { Psm, Spm };

struct InfillTokens {
  int64_t bos = 0, fim_prefix = 0, fim_suffix = 0, fim_middle = 0;
  int64_t file_sep = -1;  // -1: the vocabulary has none
};
// The tokenizer's ids; file_sep is <|file_sep|> when the model has it.
InfillTokens infill_tokens(const data::Tokenizer& tok);

struct InfillPrompt {
  std::vector<int64_t> ids;
  bool truncated = false;    // an extra chunk, or part of the prefix or suffix, was left out for the budget
  int64_t context_end = 0;   // ids[0, context_end): <|bos|>, the extra chunks and the current file's header, the
                             // part that stays the same while the user types in one file (a cache snapshot point)
  int64_t extra_kept = 0;    // extra chunks in the prompt
  int64_t extra_dropped = 0;  // left out: for the budget, or (all of them) for want of a file separator
  int64_t prefix_tokens = 0, suffix_tokens = 0;  // of P and S as kept
};

using InfillEncode = std::function<std::vector<int64_t>(std::string_view)>;

InfillPrompt build_infill_prompt(const InfillRequest& request, InfillOrder order, int64_t max_tokens,
                                 const InfillTokens& tokens, const InfillEncode& encode);
InfillPrompt build_infill_prompt(const InfillRequest& request, InfillOrder order, int64_t max_tokens,
                                 const data::Tokenizer& tok);

}  // namespace slm::text
