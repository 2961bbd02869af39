#include "slm/recipe/plan.h"

#include <sstream>

#include "slm/util/error.h"

namespace slm {

std::string LayerPlan::features() const {
  std::ostringstream s;
  const char* sep = "";
  if (family == Family::Attention) {
    s << "window=" << window;
    if (window_tokens) s << ":" << window_tokens;
    sep = " ";
  }
  if (dsa) s << sep << "dsa", sep = " ";
  if (mla) s << sep << "mla", sep = " ";
  if (engram) s << sep << "engram", sep = " ";
  if (mhc) s << sep << "mhc", sep = " ";
  if (declared != letter) s << sep << "(" << declared << "->" << letter << " by moe.layer_freq)";
  return s.str();
}

std::string tile_pattern(const std::string& pattern, int depth) {
  if (pattern.empty()) throw Error("pattern must not be empty");
  std::string out;
  out.reserve(depth);
  for (int i = 0; i < depth; ++i) out.push_back(pattern[i % pattern.size()]);
  return out;
}

namespace {

std::string field(const Recipe& r, const std::string& path) { return r.source + ": " + path; }

void require_section(const Recipe& r, char letter, const std::string& where) {
  const PatternLetter& l = pattern_letter(letter);
  if (!l.configured(r))
    throw Error(field(r, l.name) + ": section is required because " + where + " has " + std::string(1, letter) +
                " layers");
}

std::vector<LayerPlan> build_stack(const std::string& letters) {
  std::vector<LayerPlan> layers;
  std::map<char, int> rank;
  for (int i = 0; i < static_cast<int>(letters.size()); ++i) {
    LayerPlan l;
    l.index = i;
    l.declared = l.letter = letters[i];
    l.family = family_of(l.letter);
    l.family_rank = rank[l.letter]++;
    layers.push_back(l);
  }
  return layers;
}

void check_on_attention(const Recipe& r, const ModelPlan& p, const LayerSet& set, const std::string& path,
                        const char* what) {
  if (set.kind != LayerSet::Kind::List) return;
  for (int l : set.list)
    if (p.layers[l].family != Family::Attention)
      throw Error(field(r, path) + ": layer " + std::to_string(l) + " is an " + std::string(1, p.layers[l].letter) +
                  " layer; " + what + " is placed on A (attention) layers only");
}

}  // namespace

ModelPlan make_plan(const Recipe& r) {
  ModelPlan p;
  std::string declared = tile_pattern(r.pattern, r.depth);
  p.layers = build_stack(declared);

  // moe.layer_freq: only every k-th E slot keeps its router; the others become dense F layers.
  if (r.moe && r.moe->layer_freq > 1) {
    for (auto& l : p.layers)
      if (l.family == Family::MoE && l.family_rank % r.moe->layer_freq != 0) {
        l.family = Family::MLP;
        l.letter = pattern_letter(Family::MLP).letter;
      }
    std::string letters;
    for (auto& l : p.layers) letters.push_back(l.letter);
    auto rebuilt = build_stack(letters);
    for (size_t i = 0; i < rebuilt.size(); ++i) rebuilt[i].declared = p.layers[i].declared;
    p.layers = rebuilt;
  }
  for (auto& l : p.layers) {
    p.expanded.push_back(l.letter);
    p.composition[l.letter]++;
  }
  for (auto& [letter, n] : p.composition) require_section(r, letter, "the pattern");

  if (r.attention) {
    const auto& a = *r.attention;
    int n_attn = 0;
    for (const auto& l : p.layers) n_attn += l.family == Family::Attention;
    for (auto& l : p.layers) {
      if (l.family != Family::Attention) continue;
      bool last = l.family_rank == n_attn - 1;
      l.window = last ? 'L' : a.window_pattern[l.family_rank % a.window_pattern.size()];
      l.window_tokens = l.window == 'S' ? a.short_window : 0;
      l.mla = a.mla_layers.contains(l.index);
    }
    check_on_attention(r, p, a.mla_layers, "attention.mla_layers", "MLA");
    if (a.dsa_layers && !a.dsa_enabled)
      throw Error(field(r, "attention.dsa_layers") + ": DSA layers are listed but dsa_enabled is false");
    if (a.dsa_enabled) {
      LayerSet dsa;
      if (a.dsa_layers) {
        dsa.kind = LayerSet::Kind::List;
        dsa.list = *a.dsa_layers;
        check_on_attention(r, p, dsa, "attention.dsa_layers", "DSA");
      } else {
        dsa.kind = LayerSet::Kind::All;
      }
      int placed = 0;
      for (auto& l : p.layers)
        if (l.family == Family::Attention && l.index >= a.dsa_start_layer && dsa.contains(l.index))
          l.dsa = true, ++placed;
      if (placed == 0)
        throw Error(field(r, "attention.dsa_start_layer") + ": DSA is enabled but no A layer is at or after layer " +
                    std::to_string(a.dsa_start_layer));
    }
  }

  if (r.engram.enabled) {
    check_on_attention(r, p, r.engram.layers, "engram.layers", "Engram");
    long long tables = 0;
    for (auto& l : p.layers)
      if ((l.engram = l.family == Family::Attention && r.engram.layers.contains(l.index)))
        tables += static_cast<long long>(r.engram.orders.size()) * r.engram.heads_per_order;
    // Each table's size is a prime found by trial division (recipe/accounting.cpp); the shipped recipes have at
    // most a few hundred tables, and an unbounded count (heads_per_order up to 2^31 - 1) never finished.
    constexpr long long kMaxTables = 4096;
    if (tables > kMaxTables)
      throw Error(field(r, "engram") + ": " + std::to_string(tables) + " tables (Engram layers x orders x " +
                  "heads_per_order), more than the " + std::to_string(kMaxTables) + " allowed");
  }
  if (r.mhc.enabled)
    for (auto& l : p.layers) l.mhc = r.mhc.layers.contains(l.index);

  p.mtp_depth = r.mtp.depth;
  if (r.mtp.depth > 0) {
    p.mtp_layers = build_stack(r.mtp.pattern);
    for (auto& l : p.mtp_layers) {
      require_section(r, l.letter, "mtp.pattern");
      if (l.family == Family::Attention) l.window = 'L', l.mla = r.mtp.mla;
    }
  }
  return p;
}

}  // namespace slm
