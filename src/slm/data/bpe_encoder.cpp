#include "slm/data/bpe_encoder.h"

#include <algorithm>
#include <cstring>
#include <optional>

namespace slm::data {

namespace {

const std::string kSpaceMarker = "\xe2\x96\x81";  // U+2581, sentencepiece's escaped space

// The fields of sentencepiece_model.proto this encoder depends on (the Debian package ships no generated
// header, so the protobuf wire format is read directly). Defaults are the proto's.
struct ModelSpec {
  struct Entry {
    std::string text;
    float score = 0;
    int type = 1;  // NORMAL=1 UNKNOWN=2 CONTROL=3 USER_DEFINED=4 UNUSED=5 BYTE=6
  };
  std::vector<Entry> pieces;
  int model_type = 1;  // UNIGRAM=1 BPE=2
  bool byte_fallback = false;
  bool has_charsmap = false, add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

class WireReader {
 public:
  WireReader(const char* p, size_t n) : p_(reinterpret_cast<const uint8_t*>(p)), end_(p_ + n) {}
  bool done() const { return p_ >= end_; }
  // Next field: number and wire type; for length-delimited fields *bytes, otherwise *value (fixed32 raw bits).
  bool next(uint32_t* field, uint32_t* wire, uint64_t* value, std::string_view* bytes) {
    uint64_t tag;
    if (!varint(&tag)) return false;
    *field = static_cast<uint32_t>(tag >> 3);
    *wire = static_cast<uint32_t>(tag & 7);
    switch (*wire) {
      case 0: return varint(value);
      case 1: return skip(8);
      case 5:
        if (end_ - p_ < 4) return false;
        *value = p_[0] | (p_[1] << 8) | (p_[2] << 16) | (static_cast<uint64_t>(p_[3]) << 24);
        p_ += 4;
        return true;
      case 2: {
        uint64_t len;
        if (!varint(&len) || len > static_cast<uint64_t>(end_ - p_)) return false;
        *bytes = std::string_view(reinterpret_cast<const char*>(p_), len);
        p_ += len;
        return true;
      }
      default: return false;
    }
  }

 private:
  bool varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && p_ < end_; shift += 7) {
      const uint8_t b = *p_++;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) return true;
    }
    return false;
  }
  bool skip(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    p_ += n;
    return true;
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

// Calls fn(field, wire, value, bytes) for each field of a message; false when the bytes are malformed.
template <class Fn>
bool for_each_field(std::string_view msg, Fn fn) {
  WireReader r(msg.data(), msg.size());
  while (!r.done()) {
    uint32_t field, wire;
    uint64_t value = 0;
    std::string_view bytes;
    if (!r.next(&field, &wire, &value, &bytes)) return false;
    fn(field, wire, value, bytes);
  }
  return true;
}

// Parses with protobuf's merge semantics (a later occurrence of a field overrides or merges into an earlier one).
std::optional<ModelSpec> parse_model(std::string_view bytes) {
  ModelSpec m;
  bool ok = true;
  ok &= for_each_field(bytes, [&](uint32_t field, uint32_t wire, uint64_t, std::string_view sub) {
    if (wire != 2) return;
    if (field == 1) {
      ModelSpec::Entry e;
      ok &= for_each_field(sub, [&](uint32_t f, uint32_t w, uint64_t v, std::string_view b) {
        if (f == 1 && w == 2) e.text = std::string(b);
        if (f == 2 && w == 5) {
          const auto bits = static_cast<uint32_t>(v);
          std::memcpy(&e.score, &bits, sizeof bits);
        }
        if (f == 3 && w == 0) e.type = static_cast<int>(v);
      });
      m.pieces.push_back(std::move(e));
    } else if (field == 2) {
      ok &= for_each_field(sub, [&](uint32_t f, uint32_t w, uint64_t v, std::string_view) {
        if (f == 3 && w == 0) m.model_type = static_cast<int>(v);
        if (f == 35 && w == 0) m.byte_fallback = v != 0;
      });
    } else if (field == 3) {
      ok &= for_each_field(sub, [&](uint32_t f, uint32_t w, uint64_t v, std::string_view b) {
        if (f == 2 && w == 2) m.has_charsmap = !b.empty();
        if (f == 3 && w == 0) m.add_dummy_prefix = v != 0;
        if (f == 4 && w == 0) m.remove_extra_whitespaces = v != 0;
        if (f == 5 && w == 0) m.escape_whitespaces = v != 0;
      });
    }
  });
  if (!ok) return std::nullopt;
  return m;
}

// A piece's text as it matches raw input: sentencepiece sees every input space as U+2581.
std::optional<std::string> raw_text(const std::string& piece) {
  if (piece.find(' ') != std::string::npos) return std::nullopt;  // no normalized text holds a plain space
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, 3, kSpaceMarker) == 0)
      out += ' ', i += 3;
    else
      out += piece[i++];
  }
  return out;
}

inline size_t char_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

inline uint32_t pack_char(const char* p, size_t len) {
  uint32_t v = 0;
  for (size_t i = 0; i < len; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

namespace {

uint64_t hash_bytes(std::string_view s) {
  // Multiply-xorshift over 8-byte words: keys are short and this is on the hot path.
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 29);
}

}  // namespace

template <class V>
const V* BpeEncoder::StringTable<V>::find(std::string_view key) const {
  if (slots_.empty()) return nullptr;
  const uint64_t h = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.len == 0) return nullptr;
    if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)
      return &s.value;
  }
}

template <class V>
void BpeEncoder::StringTable<V>::insert(std::string_view key, V value) {
  if (2 * (size_ + 1) > slots_.size()) {  // keep the load at most 1/2: probes stay short
    std::vector<Slot> old(std::max<size_t>(64, 2 * slots_.size()));
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.len)
        for (size_t i = s.hash & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1))
          if (slots_[i].len == 0) {
            slots_[i] = s;
            break;
          }
  }
  const uint64_t h = hash_bytes(key);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].len) i = (i + 1) & mask;
  slots_[i] = {h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), value};
  arena_.append(key);
  ++size_;
}

template <class V>
void BpeEncoder::StringTable<V>::clear() {
  slots_.clear();
  arena_.clear();
  size_ = 0;
}

std::unique_ptr<BpeEncoder> BpeEncoder::create(const std::string& model_bytes, std::string* why_not,
                                               size_t max_cached_chunks) {
  auto fail = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return nullptr;
  };
  const auto spec = parse_model(model_bytes);
  if (!spec) return fail("the model is not a readable ModelProto");
  if (spec->model_type != 2) return fail("not a BPE model");
  if (spec->has_charsmap) return fail("the model has normalization rules");
  if (spec->add_dummy_prefix || spec->remove_extra_whitespaces || !spec->escape_whitespaces)
    return fail("the model adds a dummy prefix, removes whitespace or does not escape it");
  if (!spec->byte_fallback) return fail("the model has no byte fallback");

  std::unique_ptr<BpeEncoder> e(new BpeEncoder());
  e->max_cached_chunks_ = max_cached_chunks;
  std::unordered_map<std::string, uint32_t> reserved;  // control, unknown and byte pieces by raw text
  std::fill(std::begin(e->byte_id_), std::end(e->byte_id_), UINT32_MAX);
  for (uint32_t id = 0; id < spec->pieces.size(); ++id) {
    const auto& p = spec->pieces[id];
    if (p.type == 4 || p.type == 5) return fail("the model has user-defined or unused pieces");
    if (p.type == 6 && p.text.size() == 6 && p.text.starts_with("<0x") && p.text.ends_with(">"))
      e->byte_id_[std::stoul(p.text.substr(3, 2), nullptr, 16)] = id;
    if (p.type != 1)
      if (auto raw = raw_text(p.text)) reserved.try_emplace(*raw, id);
  }
  if (std::count(std::begin(e->byte_id_), std::end(e->byte_id_), UINT32_MAX) > 0)
    return fail("the model lacks byte pieces");

  std::memset(e->ascii_join_, 0, sizeof e->ascii_join_);
  std::unordered_map<std::string, uint32_t> single;  // one-character pieces
  for (uint32_t id = 0; id < spec->pieces.size(); ++id) {
    const auto& p = spec->pieces[id];
    if (p.type != 1) continue;
    auto raw = raw_text(p.text);
    if (!raw || raw->empty()) continue;
    // sentencepiece's PieceToId looks in the reserved pieces first.
    const auto r = reserved.find(*raw);
    const uint32_t out_id = r != reserved.end() ? r->second : id;
    if (e->pieces_.find(*raw)) return fail("the model has a duplicate piece");
    e->pieces_.insert(*raw, Piece{out_id, p.score});
    const std::string& s = *raw;
    size_t prev = 0, prev_len = 0;
    for (size_t i = 0; i < s.size();) {
      const size_t len = std::min(char_len(static_cast<unsigned char>(s[i])), s.size() - i);
      if (prev_len) {
        const uint32_t a = pack_char(s.data() + prev, prev_len), b = pack_char(s.data() + i, len);
        if (a < 128 && b < 128)
          e->ascii_join_[a][b] = true;
        else
          e->join_.insert(static_cast<uint64_t>(a) << 32 | b);
      }
      prev = i, prev_len = len;
      i += len;
    }
    if (prev_len == s.size()) single.try_emplace(s, out_id);
  }
  // A character that stays a symbol of its own: a reserved piece, else a piece, else byte fallback (UINT32_MAX).
  auto lookup = [&](const std::string& c) {
    if (auto r = reserved.find(c); r != reserved.end()) return r->second;
    if (auto s = single.find(c); s != single.end()) return s->second;
    return UINT32_MAX;
  };
  for (int c = 0; c < 128; ++c) e->ascii_id_[c] = lookup(std::string(1, static_cast<char>(c)));
  for (const auto& [text, id] : single)
    if (text.size() > 1) e->char_id_[pack_char(text.data(), text.size())] = lookup(text);
  for (const auto& [text, id] : reserved)
    if (!text.empty() && text.size() == char_len(static_cast<unsigned char>(text[0])) && text.size() > 1)
      e->char_id_[pack_char(text.data(), text.size())] = id;
  return e;
}

void BpeEncoder::append_char(std::string_view c, std::vector<uint32_t>& out) const {
  uint32_t id = UINT32_MAX;
  if (c.size() == 1) {
    id = ascii_id_[static_cast<unsigned char>(c[0])];
  } else if (auto it = char_id_.find(pack_char(c.data(), c.size())); it != char_id_.end()) {
    id = it->second;
  }
  if (id != UINT32_MAX) {
    out.push_back(id);
    return;
  }
  // Byte fallback spells out the normalized character: an unknown space is U+2581's three bytes.
  const std::string_view bytes = c == " " ? std::string_view(kSpaceMarker) : c;
  for (unsigned char b : bytes) out.push_back(byte_id_[b]);
}

struct BpeEncoder::Scratch {
  struct Symbol {
    uint32_t begin, len;
    int prev, next;
    uint32_t id;  // the merged piece's id; UINT32_MAX while the symbol is one character
  };
  struct Candidate {
    float score;
    int left, right;
    uint32_t len, id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> agenda;
};

void BpeEncoder::encode_chunk(std::string_view chunk, Scratch& s, std::vector<uint32_t>& out) const {
  auto& sym = s.symbols;
  auto& agenda = s.agenda;
  sym.clear();
  agenda.clear();
  for (uint32_t i = 0; i < chunk.size();) {
    const auto len = static_cast<uint32_t>(char_len(static_cast<unsigned char>(chunk[i])));
    const int k = static_cast<int>(sym.size());
    sym.push_back({i, len, k - 1, i + len < chunk.size() ? k + 1 : -1, UINT32_MAX});
    i += len;
  }
  // sentencepiece's agenda order: the highest score first, then the leftmost pair.
  auto later = [](const Scratch::Candidate& a, const Scratch::Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  auto add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const uint32_t len = sym[l].len + sym[r].len;
    const Piece* p = pieces_.find(chunk.substr(sym[l].begin, len));
    if (!p) return;
    agenda.push_back({p->score, l, r, len, p->id});
    std::push_heap(agenda.begin(), agenda.end(), later);
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) add(i - 1, i);
  while (!agenda.empty()) {
    std::pop_heap(agenda.begin(), agenda.end(), later);
    const auto top = agenda.back();
    agenda.pop_back();
    auto& l = sym[top.left];
    auto& r = sym[top.right];
    // A stale pair: one side has merged with something else since it was queued.
    if (l.len == 0 || r.len == 0 || l.len + r.len != top.len) continue;
    l.len = top.len;
    l.id = top.id;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = top.left;
    r.len = 0;
    add(l.prev, top.left);
    add(top.left, l.next);
  }
  for (int i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id != UINT32_MAX)
      out.push_back(sym[i].id);
    else
      append_char(chunk.substr(sym[i].begin, sym[i].len), out);
  }
}

void BpeEncoder::encode(std::string_view text, std::vector<uint32_t>& out) const {
  std::unique_lock<std::mutex> lock(cache_mu_, std::try_to_lock);
  Cache* cache = lock.owns_lock() ? &cache_ : nullptr;  // another thread holds the table: encode without it
  Scratch scratch;
  auto emit = [&](std::string_view chunk) {
    if (chunk.size() == char_len(static_cast<unsigned char>(chunk[0]))) return append_char(chunk, out);
    if (!cache || chunk.size() > kMaxCachedChunk) return encode_chunk(chunk, scratch, out);
    if (const auto* hit = cache->chunks.find(chunk)) {
      const auto [offset, count] = *hit;
      out.insert(out.end(), cache->ids.begin() + offset, cache->ids.begin() + offset + count);
      return;
    }
    const size_t first = out.size();
    encode_chunk(chunk, scratch, out);
    if (cache->chunks.size() >= max_cached_chunks_) {
      cache->chunks.clear();
      cache->ids.clear();
    }
    cache->chunks.insert(chunk, {static_cast<uint32_t>(cache->ids.size()), static_cast<uint32_t>(out.size() - first)});
    cache->ids.insert(cache->ids.end(), out.begin() + first, out.end());
  };
  size_t start = 0;
  uint32_t prev = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t len = char_len(static_cast<unsigned char>(text[i]));
    const uint32_t cur = pack_char(text.data() + i, len);
    if (i > start) {
      const bool join =
          prev < 128 && cur < 128 ? ascii_join_[prev][cur] : join_.contains(static_cast<uint64_t>(prev) << 32 | cur);
      if (!join) {
        emit(text.substr(start, i - start));
        start = i;
      }
    }
    prev = cur;
    i += len;
  }
  if (start < text.size()) emit(text.substr(start));
}

}  // namespace slm::data
