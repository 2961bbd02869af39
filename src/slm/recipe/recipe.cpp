#include "slm/recipe/recipe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "slm/recipe/letters.h"
#include "slm/recipe/plan.h"
#include "slm/util/json_reader.h"

namespace slm {

bool LayerSet::contains(int layer) const {
  switch (kind) {
    case Kind::None: return false;
    case Kind::All: return true;
    case Kind::List: return std::find(list.begin(), list.end(), layer) != list.end();
  }
  return false;
}

std::string LayerSet::describe() const {
  if (kind == Kind::None) return "none";
  if (kind == Kind::All) return "all";
  std::ostringstream s;
  for (size_t i = 0; i < list.size(); ++i) s << (i ? "," : "") << list[i];
  return s.str();
}

int Mamba3Config::rope_angles() const {
  int split = static_cast<int>(std::floor(d_state * rope_fraction));
  if (split % 2) --split;
  return split / 2;
}

long long Mamba3Config::in_proj_width(int d_model) const {
  long long di = 1LL * d_model * expand;
  long long h = di / headdim;
  // In 128 bits: ngroups * rank * d_state alone may pass 2^63 for sizes a recipe allows (each up to 2^31 - 1).
  const __int128 w = 2 * static_cast<__int128>(di) + static_cast<__int128>(2) * ngroups * rank() * d_state + 3 * h +
                     rope_angles();
  if (w > std::numeric_limits<long long>::max()) throw Error("mamba3: the input projection width overflows 64 bits");
  return static_cast<long long>(w);
}

std::string EngramConfig::orders_text() const {
  std::ostringstream s;
  for (size_t i = 0; i < orders.size(); ++i) s << (i ? "," : "") << orders[i];
  return s.str();
}

bool is_pattern_letter(char c) { return find_pattern_letter(c) != nullptr; }

namespace {

// Far past any real model (the shipped ones have at most 52 layers and 1 MTP module), and small enough that the plan
// and the accounting of a recipe stay a few MB: without them a "depth" of 2^31 - 1 made make_plan allocate 2 GB for
// the pattern alone and then run out of memory.
constexpr long long kMaxDepth = 4096;
constexpr long long kMaxMtpDepth = 64;

int positive_int(const JsonObjectReader& r, const std::string& key, long long value) {
  if (value <= 0) r.fail(key, "must be a positive integer, got " + std::to_string(value));
  if (value > (1LL << 31) - 1) r.fail(key, "is too large (" + std::to_string(value) + ")");
  return static_cast<int>(value);
}
int req_pos(const JsonObjectReader& r, const std::string& key) { return positive_int(r, key, r.get_int(key)); }
int opt_pos(const JsonObjectReader& r, const std::string& key, int fallback) {
  return r.has(key) ? positive_int(r, key, r.get_int(key)) : fallback;
}
double opt_positive_double(const JsonObjectReader& r, const std::string& key, double fallback) {
  double v = r.get_double(key, fallback);
  if (!(v > 0) || !std::isfinite(v)) r.fail(key, "must be a positive number, got " + std::to_string(v));
  return v;
}
double opt_double_in(const JsonObjectReader& r, const std::string& key, double fallback, double lo, double hi) {
  double v = r.get_double(key, fallback);
  if (!(v >= lo && v <= hi)) {
    std::ostringstream m;
    m << "must be in [" << lo << ", " << hi << "], got " << v;
    r.fail(key, m.str());
  }
  return v;
}

void check_pattern_letters(const JsonObjectReader& r, const std::string& key, const std::string& pattern) {
  if (pattern.empty()) r.fail(key, "must not be empty");
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (is_pattern_letter(c)) continue;
    std::ostringstream msg;
    if (c == 'C') msg << "pattern letter 'C' at position " << i << " is reserved and has no implementation";
    else msg << "unknown pattern letter '" << c << "' at position " << i;
    msg << "; known letters: " << known_letters_text();
    r.fail(key, msg.str());
  }
}

LayerSet read_layer_set(const JsonObjectReader& r, const std::string& key, int depth, LayerSet fallback) {
  if (!r.has(key)) return fallback;
  const auto& v = r.get(key);
  LayerSet s;
  if (v.is_string()) {
    std::string t = v.get<std::string>();
    if (t == "all") s.kind = LayerSet::Kind::All;
    else if (t == "none") s.kind = LayerSet::Kind::None;
    else r.fail(key, "expected \"all\", \"none\" or a list of layer indices, got \"" + t + "\"");
    return s;
  }
  if (!v.is_array()) r.fail(key, "expected \"all\", \"none\" or a list of layer indices");
  s.kind = LayerSet::Kind::List;
  for (const auto& e : v) {
    if (!e.is_number_integer()) r.fail(key, "layer indices must be integers, got " + e.dump());
    long long i = e.get<long long>();
    if (i < 0 || i >= depth)
      r.fail(key, "layer " + std::to_string(i) + " is outside the model (depth " + std::to_string(depth) + ")");
    if (std::find(s.list.begin(), s.list.end(), static_cast<int>(i)) != s.list.end())
      r.fail(key, "layer " + std::to_string(i) + " is listed twice");
    s.list.push_back(static_cast<int>(i));
  }
  std::sort(s.list.begin(), s.list.end());
  return s;
}

AttentionConfig read_attention(const JsonObjectReader& r, int depth) {
  AttentionConfig a;
  a.heads = req_pos(r, "heads");
  a.kv_heads = req_pos(r, "kv_heads");
  a.head_dim = req_pos(r, "head_dim");
  if (a.kv_heads > a.heads)
    r.fail("kv_heads", "kv_heads (" + std::to_string(a.kv_heads) + ") must not exceed heads (" +
                           std::to_string(a.heads) + ")");
  if (a.heads % a.kv_heads != 0)
    r.fail("kv_heads", "heads (" + std::to_string(a.heads) + ") must be divisible by kv_heads (" +
                           std::to_string(a.kv_heads) + ")");
  if (a.head_dim % 2) r.fail("head_dim", "must be even for rotary embeddings, got " + std::to_string(a.head_dim));
  a.rope_theta = opt_positive_double(r, "rope_theta", a.rope_theta);
  a.qk_norm = r.get_bool("qk_norm", a.qk_norm);
  a.window_pattern = r.get_string("window_pattern", a.window_pattern);
  if (a.window_pattern.empty()) r.fail("window_pattern", "must not be empty");
  for (size_t i = 0; i < a.window_pattern.size(); ++i) {
    char c = a.window_pattern[i];
    if (c != 'L' && c != 'S')
      r.fail("window_pattern", "unknown window letter '" + std::string(1, c) + "' at position " + std::to_string(i) +
                                   "; known: L (full context), S (short window)");
  }
  bool has_short = a.window_pattern.find('S') != std::string::npos;
  if (has_short) a.short_window = req_pos(r, "short_window");
  else a.short_window = opt_pos(r, "short_window", 0);

  a.dsa_enabled = r.get_bool("dsa_enabled", false);
  long long start = r.get_int("dsa_start_layer", 0);
  if (start < 0 || start >= depth)
    r.fail("dsa_start_layer", "dsa_start_layer (" + std::to_string(start) + ") is beyond the model's depth (" +
                                  std::to_string(depth) + " layers, indices 0.." + std::to_string(depth - 1) + ")");
  a.dsa_start_layer = static_cast<int>(start);
  if (r.has("dsa_layers")) {
    LayerSet s = read_layer_set(r, "dsa_layers", depth, {});
    if (s.kind != LayerSet::Kind::List) r.fail("dsa_layers", "expected a list of layer indices");
    for (int l : s.list)
      if (l < a.dsa_start_layer)
        r.fail("dsa_layers", "layer " + std::to_string(l) + " is below dsa_start_layer (" +
                                 std::to_string(a.dsa_start_layer) + ")");
    a.dsa_layers = s.list;
  }
  a.dsa_top_k_ratio = opt_double_in(r, "dsa_top_k_ratio", a.dsa_top_k_ratio, 1e-9, 1.0);
  a.dsa_local_window = opt_pos(r, "dsa_local_window", a.dsa_local_window);
  a.dsa_indexer_heads = opt_pos(r, "dsa_indexer_heads", a.dsa_indexer_heads);
  a.dsa_indexer_dim = opt_pos(r, "dsa_indexer_dim", a.dsa_indexer_dim);

  a.mla_layers = read_layer_set(r, "mla_layers", depth, {});
  if (r.has("mla")) {
    auto m = r.object("mla");
    long long q = m.get_int("q_lora_rank", 0);
    if (q < 0) m.fail("q_lora_rank", "must be 0 (no query compression) or positive, got " + std::to_string(q));
    a.mla.q_lora_rank = static_cast<int>(q);
    a.mla.kv_lora_rank = opt_pos(m, "kv_lora_rank", a.mla.kv_lora_rank);
    a.mla.qk_nope_head_dim = opt_pos(m, "qk_nope_head_dim", a.mla.qk_nope_head_dim);
    a.mla.qk_rope_head_dim = opt_pos(m, "qk_rope_head_dim", a.mla.qk_rope_head_dim);
    if (a.mla.qk_rope_head_dim % 2) m.fail("qk_rope_head_dim", "must be even for rotary embeddings");
    a.mla.v_head_dim = opt_pos(m, "v_head_dim", a.mla.v_head_dim);
    m.reject_unknown_keys();
  }
  r.reject_unknown_keys();
  return a;
}

Mamba3Config read_mamba3(const JsonObjectReader& r, int d_model) {
  Mamba3Config m;
  m.d_state = opt_pos(r, "d_state", m.d_state);
  m.expand = opt_pos(r, "expand", m.expand);
  m.headdim = opt_pos(r, "headdim", m.headdim);
  m.ngroups = opt_pos(r, "ngroups", m.ngroups);
  m.rope_fraction = opt_double_in(r, "rope_fraction", m.rope_fraction, 0.0, 1.0);
  m.dt_min = opt_positive_double(r, "dt_min", m.dt_min);
  m.dt_max = opt_positive_double(r, "dt_max", m.dt_max);
  if (m.dt_max < m.dt_min) r.fail("dt_max", "must be >= dt_min");
  m.dt_init_floor = opt_positive_double(r, "dt_init_floor", m.dt_init_floor);
  m.A_floor = opt_positive_double(r, "A_floor", m.A_floor);
  m.is_outproj_norm = r.get_bool("is_outproj_norm", m.is_outproj_norm);
  m.is_mimo = r.get_bool("is_mimo", m.is_mimo);
  m.mimo_rank = opt_pos(r, "mimo_rank", m.mimo_rank);
  m.chunk_size = opt_pos(r, "chunk_size", m.chunk_size);
  long long inner = 1LL * d_model * m.expand;
  if (inner > std::numeric_limits<int>::max())
    r.fail("expand", "d_model*expand (" + std::to_string(inner) + ") is too large (at most 2^31 - 1)");
  if (inner % m.headdim != 0)
    r.fail("headdim", "d_model*expand (" + std::to_string(inner) + ") must be divisible by headdim (" +
                          std::to_string(m.headdim) + ")");
  m.d_inner = static_cast<int>(inner);
  int derived = static_cast<int>(inner / m.headdim);
  if (r.has("heads")) {
    long long h = r.get_int("heads");
    if (h != derived)
      r.fail("heads", "explicit head count " + std::to_string(h) + " disagrees with d_model*expand/headdim = " +
                          std::to_string(derived) + " (heads are derived; remove the field or fix it)");
  }
  m.heads = derived;
  if (m.heads % m.ngroups != 0)
    r.fail("ngroups", "heads (" + std::to_string(m.heads) + ") must be divisible by ngroups (" +
                          std::to_string(m.ngroups) + ")");
  r.reject_unknown_keys();
  return m;
}

MoeConfig read_moe(const JsonObjectReader& r) {
  MoeConfig e;
  e.routed_experts = req_pos(r, "routed_experts");
  e.experts_per_token = req_pos(r, "experts_per_token");
  if (e.experts_per_token > e.routed_experts)
    r.fail("experts_per_token", "experts_per_token (" + std::to_string(e.experts_per_token) +
                                    ") must not exceed routed_experts (" + std::to_string(e.routed_experts) + ")");
  long long shared = r.get_int("shared_experts", e.shared_experts);
  if (shared < 0) r.fail("shared_experts", "must be 0 or more, got " + std::to_string(shared));
  e.shared_experts = static_cast<int>(shared);
  e.expert_hidden = req_pos(r, "expert_hidden");
  e.shared_expert_hidden = opt_pos(r, "shared_expert_hidden", e.expert_hidden);
  e.gate = r.get_string("gate", e.gate);
  if (e.gate != "sigmoid") r.fail("gate", "only \"sigmoid\" gating is supported, got \"" + e.gate + "\"");
  e.routed_scaling_factor = opt_positive_double(r, "routed_scaling_factor", e.routed_scaling_factor);
  e.bias_update_rate = opt_double_in(r, "bias_update_rate", e.bias_update_rate, 0.0, 1.0);
  e.layer_freq = opt_pos(r, "layer_freq", e.layer_freq);
  e.aux_loss_weight = opt_double_in(r, "aux_loss_weight", e.aux_loss_weight, 0.0, 1.0);
  r.reject_unknown_keys();
  return e;
}

M2rnnConfig read_m2rnn(const JsonObjectReader& r) {
  M2rnnConfig m;
  m.heads = req_pos(r, "heads");
  m.k_head_dim = opt_pos(r, "k_head_dim", m.k_head_dim);
  m.v_head_dim = opt_pos(r, "v_head_dim", m.v_head_dim);
  m.qk_heads = opt_pos(r, "qk_heads", m.qk_heads);
  if (m.heads % m.qk_heads != 0)
    r.fail("qk_heads", "heads (" + std::to_string(m.heads) + ") must be divisible by qk_heads (" +
                           std::to_string(m.qk_heads) + ")");
  m.conv_kernel = opt_pos(r, "conv_kernel", m.conv_kernel);
  r.reject_unknown_keys();
  return m;
}

std::vector<int> parse_orders(const JsonObjectReader& r, const std::string& key, const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(tok, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != tok.size()) r.fail(key, "expected comma-separated n-gram orders like \"2,3\", got \"" + text + "\"");
    if (v < 2) r.fail(key, "n-gram orders must be >= 2, got " + std::to_string(v));
    if (!out.empty() && v <= out.back()) r.fail(key, "orders must be strictly increasing, got \"" + text + "\"");
    out.push_back(v);
  }
  if (out.empty()) r.fail(key, "must list at least one order");
  return out;
}

EngramConfig read_engram(const JsonObjectReader& r, int depth) {
  EngramConfig g;
  g.enabled = r.get_bool("enabled", false);
  g.layers = read_layer_set(r, "layers", depth, {});
  if (r.has("orders")) g.orders = parse_orders(r, "orders", r.get_string("orders"));
  g.heads_per_order = opt_pos(r, "heads_per_order", g.heads_per_order);
  if (r.has("table_rows")) {
    long long rows = r.get_int("table_rows");
    if (rows <= 0) r.fail("table_rows", "must be a positive integer, got " + std::to_string(rows));
    // The tables' sizes are the next primes (found by trial division, recipe/accounting.cpp): bounded so that the
    // search stays quick, 2^32 rows being far past any table that fits in memory.
    if (rows > (1LL << 32)) r.fail("table_rows", "must be at most 2^32, got " + std::to_string(rows));
    g.table_rows = rows;
  }
  g.embed_dim = r.has("embed_dim") ? req_pos(r, "embed_dim") : 0;
  g.conv_kernel = opt_pos(r, "conv_kernel", g.conv_kernel);
  if (g.enabled) {
    if (g.layers.kind == LayerSet::Kind::None) r.fail("layers", "engram is enabled but places no layers");
    if (g.table_rows == 0) r.fail("table_rows", "required when engram is enabled");
    if (g.embed_dim == 0) r.fail("embed_dim", "required when engram is enabled");
  }
  r.reject_unknown_keys();
  return g;
}

MhcConfig read_mhc(const JsonObjectReader& r, int depth) {
  MhcConfig m;
  m.enabled = r.get_bool("enabled", false);
  m.streams = opt_pos(r, "streams", m.streams);
  if (m.enabled && m.streams < 2) r.fail("streams", "mHC needs at least 2 residual streams, got " + std::to_string(m.streams));
  LayerSet all;
  all.kind = LayerSet::Kind::All;
  m.layers = read_layer_set(r, "layers", depth, all);
  m.sinkhorn_iters = opt_pos(r, "sinkhorn_iters", m.sinkhorn_iters);
  m.temperature = opt_positive_double(r, "temperature", m.temperature);
  m.epsilon = opt_positive_double(r, "epsilon", m.epsilon);
  m.blend_alpha = opt_double_in(r, "blend_alpha", m.blend_alpha, 0.0, 1.0);
  r.reject_unknown_keys();
  return m;
}

MtpConfig read_mtp(const JsonObjectReader& r) {
  MtpConfig m;
  long long d = r.get_int("depth", 0);
  if (d < 0 || d > kMaxMtpDepth)
    r.fail("depth", "must be 0 to " + std::to_string(kMaxMtpDepth) + ", got " + std::to_string(d));
  m.depth = static_cast<int>(d);
  m.lambda = opt_double_in(r, "lambda", m.lambda, 0.0, 10.0);
  m.pattern = r.get_string("pattern", m.pattern);
  check_pattern_letters(r, "pattern", m.pattern);
  if (static_cast<long long>(m.pattern.size()) > kMaxDepth)
    r.fail("pattern", "must have at most " + std::to_string(kMaxDepth) + " letters");
  m.mla = r.get_bool("mla", m.mla);
  r.reject_unknown_keys();
  return m;
}

}  // namespace

Recipe parse_recipe_text(const std::string& text, const std::string& source) {
  nlohmann::json j = parse_json_text(text, source);
  JsonObjectReader r(j, "", source);
  Recipe rec;
  rec.source = source;
  rec.name = r.get_string("name");
  rec.notes = r.get_string("notes", "");
  rec.vocab_size = req_pos(r, "vocab_size");
  rec.d_model = req_pos(r, "d_model");
  rec.depth = req_pos(r, "depth");
  if (rec.depth > kMaxDepth) r.fail("depth", "must be at most " + std::to_string(kMaxDepth) + ", got " + std::to_string(rec.depth));
  rec.pattern = r.get_string("pattern");
  check_pattern_letters(r, "pattern", rec.pattern);
  rec.seq_len = req_pos(r, "seq_len");
  rec.norm_eps = opt_positive_double(r, "norm_eps", rec.norm_eps);
  if (r.has("attention")) rec.attention = read_attention(r.object("attention"), rec.depth);
  if (r.has("mamba3")) rec.mamba3 = read_mamba3(r.object("mamba3"), rec.d_model);
  if (r.has("moe")) rec.moe = read_moe(r.object("moe"));
  if (r.has("m2rnn")) rec.m2rnn = read_m2rnn(r.object("m2rnn"));
  if (r.has("mlp")) {
    auto m = r.object("mlp");
    rec.mlp = MlpConfig{req_pos(m, "hidden")};
    m.reject_unknown_keys();
  }
  if (r.has("engram")) rec.engram = read_engram(r.object("engram"), rec.depth);
  if (r.has("mhc")) rec.mhc = read_mhc(r.object("mhc"), rec.depth);
  if (r.has("mtp")) rec.mtp = read_mtp(r.object("mtp"));
  r.reject_unknown_keys();
  // Placement rules (which letters need which section, features on eligible layers) live with the plan.
  make_plan(rec);
  return rec;
}

Recipe load_recipe(const std::string& path) { return parse_recipe_text(read_text_file(path), path); }

}  // namespace slm
