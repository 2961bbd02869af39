#include "slm/data/fim.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "slm/data/hashing.h"
#include "slm/util/error.h"

namespace slm::data {

const std::vector<std::string>& fim_default_domains() {
  static const std::vector<std::string> d = {"cpp", "cpp-graphs", "cmake", "shell", "algorithm", "debug", "review"};
  return d;
}

FimStats& FimStats::operator+=(const FimStats& o) {
  fragments += o.fragments;
  transformed += o.transformed;
  spm += o.spm;
  skipped += o.skipped;
  padded += o.padded;
  repository += o.repository;
  return *this;
}

namespace {

// Length of the UTF-8 sequence at p when it is valid and fits in n bytes, else 1: a stray byte is a character of
// its own, so every byte string cuts somewhere and decodes back to itself.
size_t char_length(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  size_t len;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
  else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
  else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
  else return 1;
  if (n < len) return 1;
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xc0) != 0x80) return 1;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
      (cp >= 0xd800 && cp <= 0xdfff))
    return 1;
  return len;
}

// A document's text as characters: its bytes, the control tokens at their byte offsets, and the cut before every
// character (cuts.back() is the end).
struct Text {
  struct Cut {
    size_t byte = 0, special = 0;  // bytes and control tokens before the cut
  };
  std::string bytes;
  std::vector<std::pair<size_t, uint32_t>> specials;  // (byte offset, id), in order
  std::vector<Cut> cuts;
};

// Fills t.cuts from t.bytes and t.specials.
void index_characters(Text& t) {
  const auto* p = reinterpret_cast<const unsigned char*>(t.bytes.data());
  const size_t n = t.bytes.size(), ns = t.specials.size();
  size_t byte = 0, s = 0;
  t.cuts.reserve(n + ns + 1);
  t.cuts.push_back({0, 0});
  while (byte < n || s < ns) {
    if (s < ns && t.specials[s].first == byte) {
      ++s;
    } else {
      // A character never reaches over a control token: bytes of a code point split by one count one by one.
      const size_t limit = s < ns ? t.specials[s].first : n;
      byte += char_length(p + byte, limit - byte);
    }
    t.cuts.push_back({byte, s});
  }
}

Text decode_text(const Tokenizer& tok, std::span<const uint32_t> ids) {
  Text t;
  std::vector<uint32_t> run;
  auto flush = [&] {
    if (!run.empty()) t.bytes += tok.decode(run);
    run.clear();
  };
  for (uint32_t id : ids) {
    if (tok.is_special(id)) {
      flush();
      t.specials.emplace_back(t.bytes.size(), id);
    } else {
      run.push_back(id);  // decode throws for ids outside the vocabulary
    }
  }
  flush();
  index_characters(t);
  return t;
}

// A text without control tokens as characters.
Text plain_text(std::string bytes) {
  Text t;
  t.bytes = std::move(bytes);
  index_characters(t);
  return t;
}

// The ids of the text between two cuts: its pieces of text encoded, its control tokens as they were.
std::vector<uint32_t> encode_part(const Tokenizer& tok, const Text& t, Text::Cut a, Text::Cut b) {
  std::vector<uint32_t> out;
  const std::string_view bytes(t.bytes);
  auto put = [&](size_t from, size_t to) {
    if (to <= from) return;
    const auto ids = tok.encode(bytes.substr(from, to - from));
    out.insert(out.end(), ids.begin(), ids.end());
  };
  size_t pos = a.byte;
  for (size_t s = a.special; s < b.special; ++s) {
    put(pos, t.specials[s].first);
    out.push_back(t.specials[s].second);
    pos = t.specials[s].first;
  }
  put(pos, b.byte);
  return out;
}

struct Parts {
  std::vector<uint32_t> prefix, middle, suffix;
};

Parts split(const Tokenizer& tok, const Text& t, size_t a, size_t b) {
  return {encode_part(tok, t, t.cuts.front(), t.cuts[a]), encode_part(tok, t, t.cuts[a], t.cuts[b]),
          encode_part(tok, t, t.cuts[b], t.cuts.back())};
}

void layout(const Parts& p, FimOrder order, uint32_t pre, uint32_t suf, uint32_t mid, std::vector<uint32_t>& out) {
  auto put = [&](const std::vector<uint32_t>& v) { out.insert(out.end(), v.begin(), v.end()); };
  if (order == FimOrder::Psm) {
    out.push_back(pre);
    put(p.prefix);
    out.push_back(suf);
    put(p.suffix);
    out.push_back(mid);
    put(p.middle);
  } else {
    out.push_back(pre);
    out.push_back(suf);
    put(p.suffix);
    out.push_back(mid);
    put(p.prefix);
    put(p.middle);
  }
}

// The ids repository-level examples need; ok is false when the tokenizer lacks one of them.
struct GraphIds {
  uint32_t callers = 0, target = 0, callees = 0, file = 0, file_sep = 0;
  bool ok = false;
};

GraphIds graph_ids(const Tokenizer& tok) {
  GraphIds g;
  try {
    g = {tok.special_id("<|callers|>"), tok.special_id("<|target|>"),   tok.special_id("<|callees|>"),
         tok.special_id("<|file|>"),    tok.special_id("<|file_sep|>"), true};
  } catch (const Error&) {
    g.ok = false;  // a tokenizer of our own making always has them; another one gets plain FIM only
  }
  return g;
}

// A context-graph fragment read as files: the other files and the target's path line as they come before the
// sentinels, and the target's definition, the text the cuts are drawn in.
struct Repository {
  std::vector<uint32_t> head;
  Text target;
};

// "path:line" less ":line" (a path may hold colons of its own; only a trailing run of digits is a line number).
std::string_view path_of(std::string_view line) {
  const size_t colon = line.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == line.size()) return line;
  for (size_t i = colon + 1; i < line.size(); ++i)
    if (line[i] < '0' || line[i] > '9') return line;
  return line.substr(0, colon);
}

// nullopt: not a context-graph fragment with its target's marker and whole path line (fim.h says what happens then).
std::optional<Repository> read_repository(const Tokenizer& tok, const GraphIds& g, const Text& t) {
  const auto& sp = t.specials;
  std::optional<size_t> target;  // index in sp of the target's <|file|>
  for (size_t k = 0; k < sp.size(); ++k) {
    const uint32_t id = sp[k].second;
    if (id != g.callers && id != g.target && id != g.callees && id != g.file) return std::nullopt;  // not a graph
    if (!target && id == g.target && k + 1 < sp.size() && sp[k + 1].second == g.file && sp[k + 1].first == sp[k].first)
      target = k + 1;
  }
  if (!target) return std::nullopt;
  const std::string_view bytes(t.bytes);
  auto piece = [&](size_t k) {  // the text after the marker sp[k], up to the next marker or the fragment's end
    const size_t end = k + 1 < sp.size() ? sp[k + 1].first : bytes.size();
    return bytes.substr(sp[k].first, end - sp[k].first);
  };
  const std::string_view target_piece = piece(*target);
  const size_t target_nl = target_piece.find('\n');
  if (target_nl == std::string_view::npos) return std::nullopt;
  Repository r;
  auto put = [&](std::string_view path, std::string_view text) {
    r.head.push_back(g.file_sep);
    std::string chunk(path);
    chunk += '\n';
    chunk += text;
    const auto ids = tok.encode(chunk);
    r.head.insert(r.head.end(), ids.begin(), ids.end());
  };
  if (sp.front().first > 0) put("", bytes.substr(0, sp.front().first));  // a caller's tail (sp holds the target)
  for (size_t k = 0; k < sp.size(); ++k) {
    if (sp[k].second != g.file || k == *target) continue;
    const std::string_view p = piece(k);
    const size_t nl = p.find('\n');
    if (nl == std::string_view::npos) continue;  // the window cut its path line: left out
    put(path_of(p.substr(0, nl)), p.substr(nl + 1));
  }
  r.head.push_back(g.file_sep);
  const auto path = tok.encode(std::string(path_of(target_piece.substr(0, target_nl))) + "\n");
  r.head.insert(r.head.end(), path.begin(), path.end());
  r.target = plain_text(std::string(target_piece.substr(target_nl + 1)));
  return r;
}

// Distinct streams of one fragment's key.
constexpr uint64_t kDrawFim = 0x243f6a8885a308d3ULL, kDrawOrder = 0x13198a2e03707344ULL,
                   kDrawA = 0xa4093822299f31d0ULL, kDrawB = 0x082efa98ec4e6c89ULL;

}  // namespace

size_t fim_characters(const Tokenizer& tok, std::span<const uint32_t> text) {
  return decode_text(tok, text).cuts.size() - 1;
}

std::vector<uint32_t> fim_example(const Tokenizer& tok, std::span<const uint32_t> text, size_t a, size_t b,
                                  FimOrder order) {
  const Text t = decode_text(tok, text);
  if (a > b || b >= t.cuts.size())
    throw Error("fim_example: cuts " + std::to_string(a) + ", " + std::to_string(b) + " do not lie in order in a text of " +
                std::to_string(t.cuts.size() - 1) + " characters");
  std::vector<uint32_t> out;
  layout(split(tok, t, a, b), order, tok.special_id("<|fim_prefix|>"), tok.special_id("<|fim_suffix|>"),
         tok.special_id("<|fim_middle|>"), out);
  return out;
}

std::optional<size_t> fim_target_characters(const Tokenizer& tok, std::span<const uint32_t> text) {
  const GraphIds g = graph_ids(tok);
  if (!g.ok) return std::nullopt;
  const auto r = read_repository(tok, g, decode_text(tok, text));
  if (!r) return std::nullopt;
  return r->target.cuts.size() - 1;
}

std::vector<uint32_t> fim_repository_example(const Tokenizer& tok, std::span<const uint32_t> text, size_t a, size_t b,
                                             FimOrder order) {
  const GraphIds g = graph_ids(tok);
  const auto r = g.ok ? read_repository(tok, g, decode_text(tok, text)) : std::nullopt;
  if (!r) throw Error("fim_repository_example: the text is not a context-graph fragment with its target's path line");
  const Text& t = r->target;
  if (a > b || b >= t.cuts.size())
    throw Error("fim_repository_example: cuts " + std::to_string(a) + ", " + std::to_string(b) +
                " do not lie in order in a target of " + std::to_string(t.cuts.size() - 1) + " characters");
  std::vector<uint32_t> out = r->head;
  layout(split(tok, t, a, b), order, tok.special_id("<|fim_prefix|>"), tok.special_id("<|fim_suffix|>"),
         tok.special_id("<|fim_middle|>"), out);
  return out;
}

FimTransform::FimTransform(const Tokenizer& tok, std::vector<double> rates, double spm_rate, uint64_t seed)
    : tok_(tok), rates_(std::move(rates)), spm_rate_(spm_rate), seed_(seed) {
  for (double r : rates_)
    if (!(r >= 0 && r <= 1)) throw Error("FIM rate " + std::to_string(r) + " must lie in [0, 1]");
  if (!(spm_rate >= 0 && spm_rate <= 1)) throw Error("FIM SPM rate " + std::to_string(spm_rate) + " must lie in [0, 1]");
  try {
    prefix_ = tok.special_id("<|fim_prefix|>");
    suffix_ = tok.special_id("<|fim_suffix|>");
    middle_ = tok.special_id("<|fim_middle|>");
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + ": fill-in-the-middle needs a tokenizer with <|fim_prefix|>, <|fim_suffix|> "
                "and <|fim_middle|> (tokenizer/README.md)");
  }
  repository_ = graph_ids(tok).ok;
}

FimStats FimTransform::apply(Batch& batch, int64_t row0, int64_t rows) const {
  const auto& tokens = batch.tokens;
  if (!tokens.defined() || tokens.dim() != 2 || tokens.scalar_type() != torch::kLong || !tokens.is_contiguous() ||
      batch.doc_ids.sizes() != tokens.sizes() || batch.doc_ids.scalar_type() != torch::kInt ||
      !batch.doc_ids.is_contiguous())
    throw Error("FIM: the batch must hold contiguous int64 tokens and int32 document ids of one shape");
  const int64_t n = tokens.size(1);
  if (row0 < 0 || rows < 0 || row0 + rows > tokens.size(0) || static_cast<int64_t>(batch.sample.size()) < row0 + rows)
    throw Error("FIM: rows outside the batch");
  auto* tok = tokens.data_ptr<int64_t>();
  const auto* ids = batch.doc_ids.data_ptr<int32_t>();
  const auto* src = batch.source.data_ptr<int64_t>();
  FimStats st;
  for (int64_t r = row0; r < row0 + rows; ++r) {
    if (src[r] < 0 || src[r] >= static_cast<int64_t>(rates_.size()))
      throw Error("FIM: batch row " + std::to_string(r) + " comes from source " + std::to_string(src[r]) +
                  ", which has no FIM rate");
    const double rate = rates_[static_cast<size_t>(src[r])];
    if (rate > 0) st += apply_row(tok + r * n, ids + r * n, n, rate, batch.sample[static_cast<size_t>(r)]);
  }
  return st;
}

FimStats FimTransform::apply_row(int64_t* tokens, const int32_t* doc_ids, int64_t n, double rate,
                                 uint64_t sample) const {
  FimStats st;
  const uint64_t row_key = mix64(mix64(seed_ ^ 0x46494d2d6b6579ULL) ^ (sample * 0x9e3779b97f4a7c15ULL));
  uint64_t fragment = 0;
  for (int64_t begin = 0; begin < n;) {
    int64_t end = begin + 1;
    while (end < n && doc_ids[end] == doc_ids[begin]) ++end;
    ++st.fragments;
    const uint64_t key = mix64(row_key + 0xd1b54a32d192ed03ULL * ++fragment);
    if (unit_interval(key ^ kDrawFim) < rate) {
      // The document's own <|bos|> and <|eos|> keep their places; its text between them is rearranged.
      int64_t lo = begin, hi = end;
      if (lo < hi && tokens[lo] == tok_.bos_id()) ++lo;
      if (lo < hi && tokens[hi - 1] == tok_.eos_id()) --hi;
      std::vector<uint32_t> ids(static_cast<size_t>(hi - lo));
      for (int64_t i = lo; i < hi; ++i) {
        if (tokens[i] < 0 || tokens[i] > static_cast<int64_t>(UINT32_MAX))
          throw Error("FIM: token id " + std::to_string(tokens[i]) + " is not a token");
        ids[static_cast<size_t>(i - lo)] = static_cast<uint32_t>(tokens[i]);
      }
      const Text whole = decode_text(tok_, ids);
      // A context-graph fragment: the other files and the target's path line first, the cuts in the target alone.
      std::optional<Repository> repo = repository_ ? read_repository(tok_, graph_ids(tok_), whole) : std::nullopt;
      const Text& text = repo ? repo->target : whole;
      const std::vector<uint32_t> head = repo ? std::move(repo->head) : std::vector<uint32_t>{};
      const uint64_t chars = text.cuts.size() - 1;
      size_t a = static_cast<size_t>(mix64(key ^ kDrawA) % (chars + 1));
      size_t b = static_cast<size_t>(mix64(key ^ kDrawB) % (chars + 1));
      if (a > b) std::swap(a, b);
      const FimOrder order = unit_interval(key ^ kDrawOrder) < spm_rate_ ? FimOrder::Spm : FimOrder::Psm;
      Parts p = split(tok_, text, a, b);
      const int64_t room = hi - lo;
      int64_t over = static_cast<int64_t>(head.size() + p.prefix.size() + p.middle.size() + p.suffix.size()) + 3 - room;
      // Too long: the far end of the suffix goes first, then the far end (the start) of the prefix.
      int64_t cut = std::min<int64_t>(std::max<int64_t>(over, 0), static_cast<int64_t>(p.suffix.size()));
      p.suffix.resize(p.suffix.size() - static_cast<size_t>(cut));
      over -= cut;
      cut = std::min<int64_t>(std::max<int64_t>(over, 0), static_cast<int64_t>(p.prefix.size()));
      p.prefix.erase(p.prefix.begin(), p.prefix.begin() + cut);
      over -= cut;
      if (over > 0) {
        ++st.skipped;  // the middle alone does not fit: the fragment stays left-to-right
      } else {
        if (over < 0) {
          p.suffix.insert(p.suffix.end(), static_cast<size_t>(-over), tok_.pad_id());
          ++st.padded;
        }
        std::vector<uint32_t> out;
        out.reserve(static_cast<size_t>(room));
        out.insert(out.end(), head.begin(), head.end());
        layout(p, order, prefix_, suffix_, middle_, out);
        for (int64_t i = 0; i < room; ++i) tokens[lo + i] = out[static_cast<size_t>(i)];
        ++st.transformed;
        if (repo) ++st.repository;
        if (order == FimOrder::Spm) ++st.spm;
      }
    }
    begin = end;
  }
  return st;
}

}  // namespace slm::data
