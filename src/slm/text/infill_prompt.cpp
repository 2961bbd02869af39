#include "slm/text/infill_prompt.h"

#include <algorithm>

#include "slm/util/error.h"

namespace slm::text {

namespace {

using Ids = std::vector<int64_t>;

// The text before the cursor kept within cap tokens: the fewest leading lines dropped, else (the cursor's line alone
// is longer) the last cap tokens of that line.
Ids keep_end(const std::string& text, int64_t cap, const InfillEncode& encode) {
  if (cap <= 0) return {};
  Ids all = encode(text);
  if (static_cast<int64_t>(all.size()) <= cap) return all;
  std::vector<size_t> starts;  // line starts after the first, in order: keeping less text each
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') starts.push_back(i + 1);
  // The first start whose rest fits (token counts fall as more lines go).
  size_t lo = 0, hi = starts.size();
  while (lo < hi) {
    const size_t m = (lo + hi) / 2;
    if (static_cast<int64_t>(encode(std::string_view(text).substr(starts[m])).size()) <= cap) hi = m;
    else lo = m + 1;
  }
  if (lo < starts.size()) {
    Ids kept = encode(std::string_view(text).substr(starts[lo]));
    if (static_cast<int64_t>(kept.size()) <= cap) return kept;
  }
  Ids line = encode(std::string_view(text).substr(starts.empty() ? 0 : starts.back()));
  if (static_cast<int64_t>(line.size()) > cap) line.erase(line.begin(), line.end() - cap);
  return line;
}

// The text after the cursor kept within cap tokens: the most leading lines that fit, else the first cap tokens of
// its first line.
Ids keep_start(const std::string& text, int64_t cap, const InfillEncode& encode) {
  if (cap <= 0) return {};
  Ids all = encode(text);
  if (static_cast<int64_t>(all.size()) <= cap) return all;
  std::vector<size_t> ends;  // ends of whole lines (after their newline), in order: keeping more text each
  for (size_t i = 0; i + 1 < text.size(); ++i)
    if (text[i] == '\n') ends.push_back(i + 1);
  // The last end whose text fits.
  size_t lo = 0, hi = ends.size();  // answer: ends[lo - 1]
  while (lo < hi) {
    const size_t m = (lo + hi) / 2;
    if (static_cast<int64_t>(encode(std::string_view(text).substr(0, ends[m])).size()) <= cap) lo = m + 1;
    else hi = m;
  }
  if (lo > 0) {
    Ids kept = encode(std::string_view(text).substr(0, ends[lo - 1]));
    if (static_cast<int64_t>(kept.size()) <= cap) return kept;
  }
  Ids line = encode(std::string_view(text).substr(0, ends.empty() ? text.size() : ends.front()));
  if (static_cast<int64_t>(line.size()) > cap) line.resize(static_cast<size_t>(cap));
  return line;
}

}  // namespace

InfillTokens infill_tokens(const data::Tokenizer& tok) {
  InfillTokens t;
  t.bos = tok.bos_id();
  t.fim_prefix = tok.special_id("<|fim_prefix|>");
  t.fim_suffix = tok.special_id("<|fim_suffix|>");
  t.fim_middle = tok.special_id("<|fim_middle|>");
  try {
    t.file_sep = tok.special_id("<|file_sep|>");
  } catch (const Error&) {
    t.file_sep = -1;  // a tokenizer made outside train_tokenizer (every committed one has it, id 18)
  }
  return t;
}

InfillPrompt build_infill_prompt(const InfillRequest& r, InfillOrder order, int64_t max_tokens, const InfillTokens& t,
                                 const InfillEncode& encode) {
  InfillPrompt out;
  const bool separator = t.file_sep >= 0;
  // The current file's header: with a separator, when there is a path to give or chunks to set it apart from.
  Ids header;
  if (separator && (!r.filename.empty() || !r.extra.empty())) {
    header.push_back(t.file_sep);
    const Ids path = encode(r.filename + "\n");
    header.insert(header.end(), path.begin(), path.end());
  }
  const int64_t fixed = 4 + static_cast<int64_t>(header.size());  // <|bos|> and the three sentinels
  const int64_t local = std::max<int64_t>(0, max_tokens - fixed);

  // 2. The text around the cursor first.
  const std::string before = r.prefix + r.prompt;
  Ids p = encode(before), s = encode(r.suffix);
  const auto np = static_cast<int64_t>(p.size()), ns = static_cast<int64_t>(s.size());
  if (np + ns > local) {
    out.truncated = true;
    const int64_t s_share = local / 4, p_share = local - s_share;
    const int64_t p_cap = ns <= s_share ? local - ns : (np <= p_share ? np : p_share);
    if (np > p_cap) p = keep_end(before, p_cap, encode);
    const int64_t s_cap = local - static_cast<int64_t>(p.size());
    if (ns > s_cap) s = keep_start(r.suffix, s_cap, encode);
  }

  // 1. The newest extra chunks that fit in the rest, whole.
  std::vector<Ids> chunks;
  if (separator) {
    int64_t room = local - static_cast<int64_t>(p.size() + s.size());
    for (auto it = r.extra.rbegin(); it != r.extra.rend(); ++it) {
      Ids c = encode(it->filename + "\n" + it->text);
      c.insert(c.begin(), t.file_sep);
      if (static_cast<int64_t>(c.size()) > room) break;  // it and every older chunk go
      room -= static_cast<int64_t>(c.size());
      chunks.push_back(std::move(c));
    }
    std::reverse(chunks.begin(), chunks.end());
    out.extra_kept = static_cast<int64_t>(chunks.size());
    out.extra_dropped = static_cast<int64_t>(r.extra.size()) - out.extra_kept;
    if (out.extra_dropped > 0) out.truncated = true;
    if (chunks.empty() && r.filename.empty()) header.clear();  // nothing to set the file apart from
  } else {
    out.extra_dropped = static_cast<int64_t>(r.extra.size());
  }

  Ids& ids = out.ids;
  ids.push_back(t.bos);
  for (const auto& c : chunks) ids.insert(ids.end(), c.begin(), c.end());
  ids.insert(ids.end(), header.begin(), header.end());
  out.context_end = static_cast<int64_t>(ids.size());
  if (order == InfillOrder::Psm) {
    ids.push_back(t.fim_prefix);
    ids.insert(ids.end(), p.begin(), p.end());
    ids.push_back(t.fim_suffix);
    ids.insert(ids.end(), s.begin(), s.end());
    ids.push_back(t.fim_middle);
  } else {
    ids.push_back(t.fim_prefix);
    ids.push_back(t.fim_suffix);
    ids.insert(ids.end(), s.begin(), s.end());
    ids.push_back(t.fim_middle);
    ids.insert(ids.end(), p.begin(), p.end());
  }
  out.prefix_tokens = static_cast<int64_t>(p.size());
  out.suffix_tokens = static_cast<int64_t>(s.size());
  return out;
}

InfillPrompt build_infill_prompt(const InfillRequest& request, InfillOrder order, int64_t max_tokens,
                                 const data::Tokenizer& tok) {
  return build_infill_prompt(request, order, max_tokens, infill_tokens(tok), [&](std::string_view text) {
    const auto ids = tok.encode(text);
    return Ids(ids.begin(), ids.end());
  });
}

}  // namespace slm::text
