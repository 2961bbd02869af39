#include "slm/recipe/accounting.h"

#include <limits>
#include <numeric>

#include "slm/util/error.h"

namespace slm {

namespace {
// Sizes multiply in 128 bits and every count is checked into 64: a recipe may give each size up to 2^31 - 1, so a
// tensor's element count (and the sums) can pass 2^63, which was signed overflow. Such a recipe is refused.
using Dim = __int128;
long long checked(Dim v) {
  if (v > std::numeric_limits<long long>::max() || v < std::numeric_limits<long long>::min())
    throw Error("recipe: a parameter count overflows 64 bits (the sizes are too large)");
  return static_cast<long long>(v);
}
long long add(long long a, Dim b) { return checked(a + b); }
}  // namespace

const char* kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::Embedding: return "embedding";
    case ParamKind::Head: return "head";
    case ParamKind::Linear: return "linear";
    case ParamKind::Expert: return "expert";
    case ParamKind::Router: return "router";
    case ParamKind::Indexer: return "indexer";
    case ParamKind::Mixing: return "mixing";
    case ParamKind::Norm: return "norm";
    case ParamKind::Vector: return "vector";
    case ParamKind::Scalar: return "scalar";
    case ParamKind::Conv: return "conv";
    case ParamKind::Table: return "table";
  }
  return "?";
}

long long ParamSpec::numel() const {
  return std::accumulate(shape.begin(), shape.end(), 1LL, [](long long a, long long b) { return checked(Dim{a} * b); });
}

// Projections and experts are matmul weights; Engram tables are row gathers whose 16-element blocks run along
// the row, so a gathered row dequantizes on its own. The token embedding, LM head, router, DSA indexer, norms and
// small vectors stay BF16 (issue 8 and the product: small or precision-sensitive). `slm quantize` uses this rule.
bool ParamSpec::quantized() const {
  return kind == ParamKind::Linear || kind == ParamKind::Expert || kind == ParamKind::Table;
}

long long nvfp4_bytes(const ParamSpec& p) {
  if (!p.quantized()) return 2 * p.numel();
  long long in = p.shape.back();
  long long out = p.shape.size() >= 2 ? p.shape[p.shape.size() - 2] : 1;
  long long matrices = p.numel() / (in * out);
  long long blocks = (in + 15) / 16;
  return checked(matrices * Dim{checked(Dim{out} * blocks * (8 + 1) + 4)});
}

namespace {

bool is_prime(long long n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (long long d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

long long active_numel(const Recipe& r, const ParamSpec& s) {
  return s.routed ? s.numel() / r.moe->routed_experts * r.moe->experts_per_token : s.numel();
}

struct Builder {
  std::vector<ParamSpec>& out;
  std::string prefix;
  std::string group;
  bool mtp;
  void add(const std::string& name, std::initializer_list<Dim> dims, ParamKind kind, bool routed = false) {
    std::vector<long long> shape;
    for (const Dim d : dims) shape.push_back(checked(d));
    out.push_back(ParamSpec{prefix + name, std::move(shape), kind, group, routed, mtp});
  }
};

void attention_params(const Recipe& r, const LayerPlan& l, Builder& b) {
  const auto& a = *r.attention;
  const Dim D = r.d_model, H = a.heads;
  if (l.mla) {
    const auto& m = a.mla;
    const Dim qk = Dim{m.qk_nope_head_dim} + m.qk_rope_head_dim;
    if (m.q_lora_rank > 0) {
      b.add("attn.wq_a.weight", {m.q_lora_rank, D}, ParamKind::Linear);
      b.add("attn.q_a_norm.weight", {m.q_lora_rank}, ParamKind::Norm);
      b.add("attn.wq_b.weight", {H * qk, m.q_lora_rank}, ParamKind::Linear);
    } else {
      b.add("attn.wq.weight", {H * qk, D}, ParamKind::Linear);
    }
    b.add("attn.wkv_a.weight", {Dim{m.kv_lora_rank} + m.qk_rope_head_dim, D}, ParamKind::Linear);
    b.add("attn.kv_a_norm.weight", {m.kv_lora_rank}, ParamKind::Norm);
    b.add("attn.wkv_b.weight", {H * (Dim{m.qk_nope_head_dim} + m.v_head_dim), m.kv_lora_rank}, ParamKind::Linear);
    b.add("attn.wo.weight", {D, H * m.v_head_dim}, ParamKind::Linear);
  } else {
    const Dim hd = a.head_dim, KV = a.kv_heads;
    b.add("attn.wq.weight", {H * hd, D}, ParamKind::Linear);
    b.add("attn.wk.weight", {KV * hd, D}, ParamKind::Linear);
    b.add("attn.wv.weight", {KV * hd, D}, ParamKind::Linear);
    b.add("attn.wo.weight", {D, H * hd}, ParamKind::Linear);
    if (a.qk_norm) {
      b.add("attn.q_norm.weight", {hd}, ParamKind::Norm);
      b.add("attn.k_norm.weight", {hd}, ParamKind::Norm);
    }
  }
  if (l.dsa) {
    const Dim HI = a.dsa_indexer_heads, dI = a.dsa_indexer_dim;
    b.add("attn.indexer.wq.weight", {HI * dI, D}, ParamKind::Indexer);
    b.add("attn.indexer.wk.weight", {dI, D}, ParamKind::Indexer);
    b.add("attn.indexer.k_norm.weight", {dI}, ParamKind::Norm);
    b.add("attn.indexer.k_norm.bias", {dI}, ParamKind::Norm);
    b.add("attn.indexer.weights_proj.weight", {HI, D}, ParamKind::Indexer);
  }
}

void moe_params(const Recipe& r, Builder& b) {
  const auto& e = *r.moe;
  const Dim D = r.d_model, N = e.routed_experts, f = e.expert_hidden;
  b.add("moe.router.weight", {N, D}, ParamKind::Router);
  b.add("moe.experts.w13", {N, 2 * f, D}, ParamKind::Expert, true);
  b.add("moe.experts.w2", {N, D, f}, ParamKind::Expert, true);
  if (e.shared_experts > 0) {
    const Dim fs = Dim{e.shared_experts} * e.shared_expert_hidden;
    b.add("moe.shared.w13.weight", {2 * fs, D}, ParamKind::Linear);
    b.add("moe.shared.w2.weight", {D, fs}, ParamKind::Linear);
  }
}

void mlp_params(const Recipe& r, Builder& b) {
  const Dim D = r.d_model, f = r.mlp->hidden;
  b.add("mlp.w13.weight", {2 * f, D}, ParamKind::Linear);
  b.add("mlp.w2.weight", {D, f}, ParamKind::Linear);
}

void mamba3_params(const Recipe& r, Builder& b) {
  const auto& m = *r.mamba3;
  const Dim D = r.d_model, H = m.heads, N = m.d_state, R = m.rank(), P = m.headdim;
  b.add("mamba.in_proj.weight", {m.in_proj_width(r.d_model), D}, ParamKind::Linear);
  b.add("mamba.dt_bias", {H}, ParamKind::Vector);
  b.add("mamba.B_bias", {H, R, N}, ParamKind::Vector);
  b.add("mamba.C_bias", {H, R, N}, ParamKind::Vector);
  b.add("mamba.B_norm.weight", {N}, ParamKind::Norm);
  b.add("mamba.C_norm.weight", {N}, ParamKind::Norm);
  if (m.is_mimo) {
    b.add("mamba.mimo_x", {H, R, P}, ParamKind::Vector);
    b.add("mamba.mimo_z", {H, R, P}, ParamKind::Vector);
    b.add("mamba.mimo_o", {H, R, P}, ParamKind::Vector);
  }
  b.add("mamba.D", {H}, ParamKind::Vector);
  if (m.is_outproj_norm) b.add("mamba.out_norm.weight", {m.d_inner}, ParamKind::Norm);
  b.add("mamba.out_proj.weight", {D, m.d_inner}, ParamKind::Linear);
}

void m2rnn_params(const Recipe& r, Builder& b) {
  const auto& m = *r.m2rnn;
  const Dim D = r.d_model, Nh = m.heads, K = m.k_head_dim, V = m.v_head_dim, nqk = m.qk_heads;
  const Dim conv_ch = 2 * nqk * K + Nh * V;
  b.add("m2rnn.in_proj.weight", {conv_ch + Nh + Nh * V, D}, ParamKind::Linear);
  b.add("m2rnn.conv.weight", {conv_ch, 1, m.conv_kernel}, ParamKind::Conv);
  b.add("m2rnn.conv.bias", {conv_ch}, ParamKind::Conv);
  b.add("m2rnn.A_log", {Nh}, ParamKind::Vector);
  b.add("m2rnn.dt_bias", {Nh}, ParamKind::Vector);
  b.add("m2rnn.state_weight", {Nh, V, V}, ParamKind::Vector);
  b.add("m2rnn.D", {Nh, V}, ParamKind::Vector);
  b.add("m2rnn.out_norm.weight", {Nh * V}, ParamKind::Norm);
  b.add("m2rnn.out_proj.weight", {D, Nh * V}, ParamKind::Linear);
}

void engram_params(const Recipe& r, int streams, const std::vector<long long>& primes, Builder& b) {
  const auto& g = r.engram;
  const Dim D = r.d_model, n = streams;
  const Dim d_e = static_cast<Dim>(g.orders.size()) * g.heads_per_order * g.embed_dim;
  const long long rows = std::accumulate(primes.begin(), primes.end(), 0LL);
  Builder t{b.out, b.prefix, "engram_table", b.mtp};
  t.add("engram.table", {rows, g.embed_dim}, ParamKind::Table);
  b.add("engram.wv.weight", {D, d_e}, ParamKind::Linear);
  b.add("engram.wk.weight", {n * D, d_e}, ParamKind::Linear);
  b.add("engram.h_norm.weight", {n, D}, ParamKind::Norm);
  b.add("engram.k_norm.weight", {n, D}, ParamKind::Norm);
  b.add("engram.conv_norm.weight", {n, D}, ParamKind::Norm);
  b.add("engram.conv.weight", {n * D, 1, g.conv_kernel}, ParamKind::Conv);
}

void mhc_params(Dim D, int streams, Builder& b) {
  const Dim n = streams;
  b.add("mhc.phi", {n * n + 2 * n, n * D}, ParamKind::Mixing);
  b.add("mhc.bias", {n * n + 2 * n}, ParamKind::Vector);
  b.add("mhc.alpha", {3}, ParamKind::Scalar);
}

}  // namespace

std::vector<ParamSpec> layer_param_specs(const Recipe& r, const LayerPlan& l, const std::string& prefix, int streams,
                                         const std::vector<long long>& engram_primes) {
  std::vector<ParamSpec> out;
  Builder b{out, prefix, family_name(l.family), false};
  b.add("norm.weight", {r.d_model}, ParamKind::Norm);
  switch (l.family) {
    case Family::Attention: attention_params(r, l, b); break;
    case Family::MoE: moe_params(r, b); break;
    case Family::MLP: mlp_params(r, b); break;
    case Family::Mamba3: mamba3_params(r, b); break;
    case Family::M2RNN: m2rnn_params(r, b); break;
  }
  if (l.engram) {
    Builder e{out, prefix, "engram", false};
    engram_params(r, streams, engram_primes, e);
  }
  if (l.mhc) {
    Builder h{out, prefix, "mhc", false};
    mhc_params(r.d_model, streams, h);
  }
  return out;
}

std::vector<std::vector<long long>> engram_table_primes(const Recipe& r, const ModelPlan& plan) {
  std::vector<std::vector<long long>> out(plan.layers.size());
  if (!r.engram.enabled) return out;
  const size_t per_layer = r.engram.orders.size() * r.engram.heads_per_order;
  long long candidate = r.engram.table_rows;
  for (const auto& l : plan.layers) {
    if (!l.engram) continue;
    for (size_t i = 0; i < per_layer; ++i) {
      while (!is_prime(candidate)) ++candidate;
      out[l.index].push_back(candidate++);
    }
  }
  return out;
}

Accounting account(const Recipe& r, const ModelPlan& plan) {
  Accounting acc;
  auto& ps = acc.params;
  const long long D = r.d_model, V = r.vocab_size, L = r.depth;
  const int streams = r.mhc.enabled ? r.mhc.streams : 1;

  ps.push_back({"embed.weight", {V, D}, ParamKind::Embedding, "embedding"});
  if (!r.mhc.enabled) {  // mHC replaces the per-layer resid/x0 scalars
    ps.push_back({"resid_lambdas", {L}, ParamKind::Scalar, "lambda"});
    ps.push_back({"x0_lambdas", {L}, ParamKind::Scalar, "lambda"});
  }
  auto primes = engram_table_primes(r, plan);
  acc.layers.resize(plan.layers.size());
  for (const auto& l : plan.layers) {
    auto specs = layer_param_specs(r, l, "layers." + std::to_string(l.index) + ".", streams, primes[l.index]);
    for (auto& s : specs) {
      if (s.kind != ParamKind::Table) {
        acc.layers[l.index].total = add(acc.layers[l.index].total, s.numel());
        acc.layers[l.index].active = add(acc.layers[l.index].active, active_numel(r, s));
      }
      ps.push_back(std::move(s));
    }
  }
  if (r.mhc.enabled) {
    const long long n = streams;
    ps.push_back({"mhc_head.phi", {n, n * D}, ParamKind::Mixing, "mhc"});
    ps.push_back({"mhc_head.bias", {n}, ParamKind::Vector, "mhc"});
    ps.push_back({"mhc_head.alpha", {1}, ParamKind::Scalar, "mhc"});
  }
  ps.push_back({"final_norm.weight", {D}, ParamKind::Norm, "norm"});
  ps.push_back({"lm_head.weight", {V, D}, ParamKind::Head, "lm_head"});

  for (int k = 0; k < plan.mtp_depth; ++k) {
    std::string pre = "mtp." + std::to_string(k) + ".";
    ps.push_back({pre + "enorm.weight", {D}, ParamKind::Norm, "mtp", false, true});
    ps.push_back({pre + "hnorm.weight", {D}, ParamKind::Norm, "mtp", false, true});
    ps.push_back({pre + "proj.weight", {D, 2 * D}, ParamKind::Linear, "mtp", false, true});
    for (const auto& l : plan.mtp_layers)
      for (auto& s : layer_param_specs(r, l, pre + "layers." + std::to_string(l.index) + ".", 1, {})) {
        s.mtp = true;
        ps.push_back(std::move(s));
      }
    ps.push_back({pre + "norm.weight", {D}, ParamKind::Norm, "mtp", false, true});
  }

  for (const auto& s : ps) {
    const long long n = s.numel();
    const long long active = active_numel(r, s);
    acc.stored = add(acc.stored, n);
    acc.bytes_bf16 = add(acc.bytes_bf16, Dim{2} * n);
    acc.bytes_nvfp4 = add(acc.bytes_nvfp4, nvfp4_bytes(s));
    if (s.kind == ParamKind::Table) {
      acc.engram_tables = add(acc.engram_tables, n);
    } else if (s.mtp) {
      acc.mtp_total = add(acc.mtp_total, n);
      acc.mtp_active = add(acc.mtp_active, active);
    } else {
      acc.total = add(acc.total, n);
      acc.active = add(acc.active, active);
      acc.by_family[s.group] = add(acc.by_family[s.group], n);
      if (s.kind == ParamKind::Embedding) acc.embedding = add(acc.embedding, n);
    }
  }
  acc.active_excl_embedding = acc.active - acc.embedding;
  for (const auto& l : plan.layers)
    if (l.engram)
      acc.engram_lookups_per_token = add(acc.engram_lookups_per_token,
                                         static_cast<Dim>(r.engram.orders.size()) * r.engram.heads_per_order *
                                             r.engram.embed_dim);
  return acc;
}

}  // namespace slm
