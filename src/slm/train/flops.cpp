#include "slm/train/flops.h"

#include <algorithm>

#include "slm/recipe/accounting.h"

namespace slm::train {

bool is_matmul(ParamKind k) {
  switch (k) {
    case ParamKind::Head:
    case ParamKind::Linear:
    case ParamKind::Expert:
    case ParamKind::Router:
    case ParamKind::Indexer:
    case ParamKind::Mixing: return true;
    default: return false;
  }
}

namespace {

// Score + value FLOPs of one attention layer per token (forward), before the x6/2 training factor.
double attention_forward(const Recipe& r, const LayerPlan& l, int64_t seq_len) {
  const auto& a = *r.attention;
  double keys = (static_cast<double>(seq_len) + 1.0) / 2.0;
  if (l.window_tokens > 0) keys = std::min(keys, static_cast<double>(l.window_tokens));
  if (l.dsa) keys = std::min(keys, std::max(a.dsa_top_k_ratio * seq_len / 2.0, static_cast<double>(a.dsa_local_window)));
  const double qk = l.mla ? a.mla.qk_nope_head_dim + a.mla.qk_rope_head_dim : a.head_dim;
  const double v = l.mla ? a.mla.v_head_dim : a.head_dim;
  double f = 2.0 * a.heads * (qk + v) * keys;
  if (l.dsa) f += 2.0 * a.dsa_indexer_heads * a.dsa_indexer_dim * ((static_cast<double>(seq_len) + 1.0) / 2.0);
  return f;
}

double scan_forward(const Recipe& r, const LayerPlan& l) {
  if (l.family == Family::Mamba3) {
    const auto& m = *r.mamba3;
    return 2.0 * 2.0 * m.heads * m.headdim * m.d_state * m.rank();
  }
  if (l.family == Family::M2RNN) {
    // Per head, H W (K×V by V×V: 2KV² FLOPs) and the k vᵀ update (2KV), then the readout Hᵀq (2KV).
    const auto& m = *r.m2rnn;
    const double kv = static_cast<double>(m.k_head_dim) * m.v_head_dim;
    return 2.0 * m.heads * kv * (m.v_head_dim + 2.0);
  }
  return 0.0;
}

}  // namespace

FlopCount flops_per_token(const Recipe& r, const ModelPlan& plan, int64_t seq_len) {
  FlopCount f;
  for (const auto& p : account(r, plan).params) {
    if (!is_matmul(p.kind)) continue;
    const double n = static_cast<double>(p.numel());
    f.matmul += 6.0 * (p.routed ? n / r.moe->routed_experts * r.moe->experts_per_token : n);
  }
  auto layers = [&](const std::vector<LayerPlan>& ls, int copies) {
    for (const auto& l : ls) {
      if (l.family == Family::Attention) f.attention += 3.0 * copies * attention_forward(r, l, seq_len);
      f.scan += 3.0 * copies * scan_forward(r, l);
    }
  };
  layers(plan.layers, 1);
  layers(plan.mtp_layers, plan.mtp_depth);
  return f;
}

}  // namespace slm::train
