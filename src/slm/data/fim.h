#pragma once
// Fill-in-the-middle (FIM) training examples (Bavarian et al. 2022, "Efficient Training of Language Models to Fill in
// the Middle"), made from the loader's windows after they are cut: the paper's context-level FIM, which keeps the
// loader's stream, its cursor and its exact resume as they are.
//
// Each document fragment of a window (a run of one document id, data::Batch::doc_ids) is transformed on its own
// with probability `rate` (per source); nothing moves across a document boundary. A transformed fragment's text
// (its tokens between a leading <|bos|> and a trailing <|eos|>, which stay where they are) is decoded, cut at two
// uniformly drawn character positions into prefix P, middle M and suffix S, and the three parts are encoded again:
//
//   PSM:  <|bos|>? <|fim_prefix|> P <|fim_suffix|> S <|fim_middle|> M <|eos|>?
//   SPM:  <|bos|>? <|fim_prefix|> <|fim_suffix|> S <|fim_middle|> P M <|eos|>?
//
// SPM is the paper's variant 2 (its section 3 and appendix; the one bigcode's Megatron-LM and Code Llama train):
// P and M are adjacent after <|fim_middle|>, so an infill prompt ends with the prefix and the model continues it
// with the middle, and a user typing at the cursor only changes the prompt's tail (the cache keeps the suffix).
// This is not llama.cpp's --spm-infill layout (<SUF> S <PRE> P <MID>); text/infill_prompt.h builds ours.
//
// Characters: the text is cut between UTF-8 code points (a byte that is not valid UTF-8 counts as one character)
// and control tokens inside a document (context-graph markers) are characters of their own, kept as their ids.
// Encoding the parts apart adds the three sentinels and usually a token or two where a cut splits a BPE piece, so
// the fragment is fitted back to its length the way Megatron-LM's FIM does: tokens are dropped from the far end of
// the suffix (then, when the suffix is used up, from the far end of the prefix); a fragment too short for that is
// left as it is. When the parts encode to fewer tokens (shards not encoded as whole documents), <|pad|> fills the
// end of the suffix. The window's length and its document ids stay exactly as they were, so attention masks and the
// recurrent-state resets (model/documents.h) stay right.
//
// Repository-level examples. A fragment of a context-graph document (data/graph_docs.h: <|callers|> (<|file|> piece)*
// <|target|> <|file|> piece <|callees|> (<|file|> piece)*, a piece being "path:line\n" + a definition + "\n") that
// holds its target's <|target|> <|file|> and the target's whole path line becomes the layout the server's infill
// prompt gives an editor's request with input_extra (text/infill_prompt.h), the document's other functions as the
// other files:
//
//   PSM:  <|bos|>? F <|fim_prefix|> P <|fim_suffix|> S <|fim_middle|> M <|eos|>?
//   SPM:  <|bos|>? F <|fim_prefix|> <|fim_suffix|> S <|fim_middle|> P M <|eos|>?
//   F:    (<|file_sep|> path\n text)* <|file_sep|> target_path\n
//
// Each chunk is a piece other than the target, in document order (callers, then callees), encoded as one text
// ("path\n" + its definition + "\n") as the server encodes an input_extra chunk; a path is the piece's path line
// less its ":line" (editors send file names, and the layouts must agree). P, M and S are the target's definition
// (its piece after the path line), cut at two characters drawn inside it alone. The markers cost what they did (the
// three section markers become the three sentinels, each <|file|> a <|file_sep|>); the line numbers left out
// usually leave a few tokens that <|pad|> fills, and the fitting above applies unchanged (the suffix's far end,
// then the prefix's start).
// Windows cut graph documents anywhere; a fragment is read as far as it goes:
//  - without its target's marker and whole path line (the window starts after it or ends inside it), a fragment
//    gets the plain FIM above, its markers kept as characters;
//  - text before the fragment's first marker (the window starts inside a caller, whose path line was in the previous
//    window) is a chunk with an empty path, as the server writes a chunk of an unnamed file;
//  - a last piece whose path line the window cuts is left out (a path cut short would be a wrong path; <|pad|> fills
//    its room); a target or chunk cut short by the window's end is kept as far as it goes.
// This is part of the transform rather than a step of its own because it needs what the transform has: windows
// already cut (a step before the loader would change its token stream and its resume), the same per-fragment draws
// (the rate, the order and the cuts mean the same for every document), and the same fitting to the fragment's length.
//
// Every draw comes from a hash of (seed, the loader's global sample index, the fragment's index in the window):
// the same windows get the same examples in a resumed run, on any number of ranks, for any batch size.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slm/data/loader.h"
#include "slm/data/tokenizer.h"

namespace slm::data {

// The domains FIM is on for by default (code, context-graph documents of code (corpus_graphs.h), and text about code
// that is edited in place): the rest stay left-to-right only.
const std::vector<std::string>& fim_default_domains();

enum class FimOrder { Psm, Spm };

// Characters of a document's text (tokens without <|bos|>/<|eos|>): the split positions run over [0, this].
size_t fim_characters(const Tokenizer& tok, std::span<const uint32_t> text);

// The FIM example of a document's text cut before character a and before character b (a <= b <= characters),
// without fitting it to any length: the sentinels and the three parts, as in the layouts above.
std::vector<uint32_t> fim_example(const Tokenizer& tok, std::span<const uint32_t> text, size_t a, size_t b,
                                  FimOrder order);

// Characters of the target's definition in a context-graph fragment (the split positions run over [0, this]);
// nullopt when the fragment holds no target with its whole path line (it gets plain FIM) or the tokenizer lacks
// the graph markers or <|file_sep|>.
std::optional<size_t> fim_target_characters(const Tokenizer& tok, std::span<const uint32_t> text);

// The repository-level example of a context-graph fragment's text (tokens without <|bos|>/<|eos|>), its target's
// definition cut before characters a and b, not fitted to any length. Throws slm::Error when the fragment has no
// target with its path line or the cuts do not lie in order in it.
std::vector<uint32_t> fim_repository_example(const Tokenizer& tok, std::span<const uint32_t> text, size_t a, size_t b,
                                             FimOrder order);

struct FimStats {
  int64_t fragments = 0;    // document fragments seen in sources with a FIM rate > 0
  int64_t transformed = 0;  // of them, turned into FIM examples
  int64_t spm = 0;          // of those, in SPM order
  int64_t skipped = 0;      // drawn for FIM but too short to fit (left as they were)
  int64_t padded = 0;       // transformed and padded with <|pad|> to their length
  int64_t repository = 0;   // transformed in the repository-level layout (context-graph fragments)
  FimStats& operator+=(const FimStats& o);
};

class FimTransform {
 public:
  // rates: per source of the loader (data::Batch::source), the share of its document fragments that become FIM
  // examples (0: untouched). spm_rate: the share of those in SPM order. The tokenizer must be the shards' and
  // outlive the transform. Throws slm::Error for rates outside [0, 1] or a tokenizer without the FIM tokens.
  FimTransform(const Tokenizer& tok, std::vector<double> rates, double spm_rate, uint64_t seed);

  // Rewrites rows [row0, row0 + rows) of batch.tokens in place (doc_ids stay as they are).
  FimStats apply(Batch& batch, int64_t row0, int64_t rows) const;
  // One window of n tokens with its document ids, drawn with the key of global sample `sample`.
  FimStats apply_row(int64_t* tokens, const int32_t* doc_ids, int64_t n, double rate, uint64_t sample) const;

  const std::vector<double>& rates() const { return rates_; }
  double spm_rate() const { return spm_rate_; }

 private:
  const Tokenizer& tok_;
  uint32_t prefix_ = 0, suffix_ = 0, middle_ = 0;  // the sentinels' ids
  bool repository_ = false;                        // the tokenizer has the graph markers and <|file_sep|>
  std::vector<double> rates_;
  double spm_rate_;
  uint64_t seed_;
};

}  // namespace slm::data
