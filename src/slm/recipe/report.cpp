#include "slm/recipe/report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "slm/util/format.h"

namespace slm {

namespace {

nlohmann::json layer_json(const LayerPlan& l, const LayerCount* count) {
  nlohmann::json j = {{"index", l.index}, {"letter", std::string(1, l.letter)}, {"family", family_name(l.family)}};
  if (l.declared != l.letter) j["declared"] = std::string(1, l.declared);
  if (l.family == Family::Attention) {
    j["window"] = std::string(1, l.window);
    j["window_tokens"] = l.window_tokens;
    j["dsa"] = l.dsa;
    j["mla"] = l.mla;
  }
  j["engram"] = l.engram;
  j["mhc"] = l.mhc;
  if (count) {
    j["params"] = count->total;
    j["active"] = count->active;
  }
  return j;
}

std::string pct(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.2f%%", 100.0 * (a - b) / b);
  return buf;
}

std::string ratio(long long a, long long b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", b ? static_cast<double>(a) / b : 0.0);
  return buf;
}

}  // namespace

nlohmann::json recipe_report_json(const Recipe& r, const ModelPlan& p, const Accounting& acc) {
  nlohmann::json j;
  j["name"] = r.name;
  j["source"] = r.source;
  j["vocab_size"] = r.vocab_size;
  j["d_model"] = r.d_model;
  j["depth"] = r.depth;
  j["pattern"] = r.pattern;
  j["expanded"] = p.expanded;
  j["seq_len"] = r.seq_len;
  nlohmann::json comp = nlohmann::json::object();
  for (const auto& [letter, n] : p.composition) comp[std::string(1, letter)] = n;
  j["composition"] = comp;
  j["layers"] = nlohmann::json::array();
  for (const auto& l : p.layers) j["layers"].push_back(layer_json(l, &acc.layers[l.index]));
  j["mtp"] = {{"depth", p.mtp_depth}, {"lambda", r.mtp.lambda}, {"layers", nlohmann::json::array()}};
  for (const auto& l : p.mtp_layers) j["mtp"]["layers"].push_back(layer_json(l, nullptr));
  j["params"] = {{"total", acc.total},
                 {"active", acc.active},
                 {"active_excl_embedding", acc.active_excl_embedding},
                 {"embedding", acc.embedding},
                 {"mtp", acc.mtp_total},
                 {"mtp_active", acc.mtp_active},
                 {"engram_tables", acc.engram_tables},
                 {"engram_lookups_per_token", acc.engram_lookups_per_token},
                 {"stored", acc.stored},
                 {"by_family", acc.by_family}};
  j["memory"] = {{"bytes_bf16", acc.bytes_bf16}, {"bytes_nvfp4", acc.bytes_nvfp4}};
  return j;
}

std::string recipe_report_text(const Recipe& r, const ModelPlan& p, const Accounting& acc) {
  std::ostringstream s;
  s << "recipe   " << r.name << "  (" << r.source << ")\n";
  s << "shape    d_model " << r.d_model << ", depth " << r.depth << ", vocab " << r.vocab_size << ", seq_len "
    << r.seq_len << "\n";
  s << "pattern  " << r.pattern << " tiled to " << r.depth << ": " << p.expanded << "\n";
  s << "composition";
  for (const auto& [letter, n] : p.composition) s << "  " << letter << " " << n;
  s << "\n\n";
  char line[256];
  std::snprintf(line, sizeof line, "%5s  %-6s %-10s %10s %10s  %s\n", "layer", "letter", "family", "params", "active",
                "features");
  s << line;
  for (const auto& l : p.layers) {
    std::snprintf(line, sizeof line, "%5d  %-6c %-10s %10s %10s  %s\n", l.index, l.letter, family_name(l.family),
                  human_count(acc.layers[l.index].total).c_str(), human_count(acc.layers[l.index].active).c_str(),
                  l.features().c_str());
    s << line;
  }
  if (p.mtp_depth > 0) {
    s << "\nMTP      " << p.mtp_depth << " module(s), lambda " << r.mtp.lambda << ", each:";
    for (const auto& l : p.mtp_layers) s << " " << l.letter << "(" << family_name(l.family) << (l.mla ? ", mla" : "") << ")";
    s << "\n";
  }
  s << "\nparameters\n";
  s << "  total (main model)          " << human_count(acc.total) << "  (" << acc.total << ")\n";
  s << "  active per token            " << human_count(acc.active) << "  (" << acc.active << ")\n";
  s << "  active without embedding    " << human_count(acc.active_excl_embedding) << "\n";
  s << "  MTP modules (separate)      " << human_count(acc.mtp_total) << " total, " << human_count(acc.mtp_active)
    << " active\n";
  s << "  Engram tables (separate)    " << human_count(acc.engram_tables) << ", " << acc.engram_lookups_per_token
    << " elements looked up per token\n";
  s << "  stored in a checkpoint      " << human_count(acc.stored) << "\n";
  s << "  by family:";
  for (const auto& [g, n] : acc.by_family) s << "  " << g << " " << human_count(n);
  s << "\nmemory   BF16 " << human_bytes(acc.bytes_bf16) << ", NVFP4 " << human_bytes(acc.bytes_nvfp4) << " ("
    << ratio(acc.bytes_bf16, acc.bytes_nvfp4) << " smaller)\n";
  return s.str();
}

nlohmann::json ensemble_report_json(const Ensemble& e) {
  nlohmann::json j;
  j["name"] = e.name;
  j["source"] = e.source;
  if (!e.router.empty()) j["router"] = e.router;
  if (!e.router_sha256.empty()) j["router_sha256"] = e.router_sha256;
  j["specialists"] = nlohmann::json::array();
  for (const auto& s : e.specialists) {
    nlohmann::json o = {{"name", s.name},
                        {"domain", s.domain},
                        {"recipe", s.recipe_path},
                        {"total", s.accounting.total},
                        {"active", s.accounting.active},
                        {"stored", s.accounting.stored},
                        {"bytes_bf16", s.accounting.bytes_bf16},
                        {"bytes_nvfp4", s.accounting.bytes_nvfp4}};
    if (!s.checkpoint.empty()) o["checkpoint"] = s.checkpoint;
    if (!s.sha256.empty()) o["sha256"] = s.sha256;
    if (!s.tokenizer.empty()) o["tokenizer"] = s.tokenizer;
    if (s.training_tokens) o["training_tokens"] = *s.training_tokens;
    if (s.heldout_bpb) o["heldout_bpb"] = *s.heldout_bpb;
    if (s.target_total > 0) o["target"] = {{"total", s.target_total}, {"active", s.target_active}};
    j["specialists"].push_back(o);
  }
  j["total"] = e.total;
  j["active"] = e.active;
  j["stored"] = e.stored;
  j["bytes_bf16"] = e.bytes_bf16;
  j["bytes_nvfp4"] = e.bytes_nvfp4;
  return j;
}

std::string ensemble_report_text(const Ensemble& e) {
  std::ostringstream s;
  s << "ensemble " << e.name << "  (" << e.source << ")\n";
  if (!e.description.empty()) s << e.description << "\n";
  char line[320];
  std::snprintf(line, sizeof line, "\n%-16s %9s %9s %8s %8s %11s %11s  %s\n", "specialist", "total", "active", "vs tgt",
                "vs tgt", "BF16", "NVFP4", "recipe");
  s << line;
  for (const auto& sp : e.specialists) {
    const auto& a = sp.accounting;
    std::string dt = sp.target_total > 0 ? pct(a.total, sp.target_total) : "-";
    std::string da = sp.target_active > 0 ? pct(a.active, sp.target_active) : "-";
    std::snprintf(line, sizeof line, "%-16s %9s %9s %8s %8s %11s %11s  %s\n", sp.name.c_str(),
                  human_count(a.total).c_str(), human_count(a.active).c_str(), dt.c_str(), da.c_str(),
                  human_bytes(a.bytes_bf16).c_str(), human_bytes(a.bytes_nvfp4).c_str(), sp.recipe_path.c_str());
    s << line;
  }
  std::snprintf(line, sizeof line, "%-16s %9s %9s %8s %8s %11s %11s\n", "sum", human_count(e.total).c_str(),
                human_count(e.active).c_str(), "", "", human_bytes(e.bytes_bf16).c_str(),
                human_bytes(e.bytes_nvfp4).c_str());
  s << line;
  s << "\nweights include MTP modules and Engram tables (stored " << human_count(e.stored) << "); NVFP4 packs "
    << "projections, experts and Engram tables at 4.5 bits per weight and keeps the rest in BF16: "
    << ratio(e.bytes_bf16, e.bytes_nvfp4) << " smaller than BF16\n";
  // The shipped lineup's provenance: what each specialist was trained on, how it scores and which exact weights
  // these are; only printed when the manifest records some of it, so the design lineups' output is unchanged.
  const bool trained = std::any_of(e.specialists.begin(), e.specialists.end(), [](const Specialist& sp) {
    return !sp.checkpoint.empty() || sp.training_tokens || sp.heldout_bpb;
  });
  if (trained || !e.router.empty()) {
    std::snprintf(line, sizeof line, "\n%-16s %15s %12s  %s\n", "specialist", "training tokens", "held-out bpb",
                  "checkpoint (sha256)");
    s << line;
    for (const auto& sp : e.specialists) {
      const std::string tokens = sp.training_tokens ? std::to_string(*sp.training_tokens) : "-";
      char bpb[32] = "-";
      if (sp.heldout_bpb) std::snprintf(bpb, sizeof bpb, "%.4f", *sp.heldout_bpb);
      const std::string ckpt = sp.checkpoint.empty() ? "-" : sp.checkpoint;
      const std::string sha = sp.sha256.empty() ? "no sha256" : sp.sha256;
      // Paths are unbounded, so only the fixed columns go through the buffer.
      std::snprintf(line, sizeof line, "%-16s %15s %12s  ", sp.name.c_str(), tokens.c_str(), bpb);
      s << line << ckpt << " (" << sha << ")\n";
    }
    if (!e.router.empty())
      s << "router: " << e.router << " (" << (e.router_sha256.empty() ? "no sha256" : e.router_sha256) << ")\n";
  }
  return s.str();
}

}  // namespace slm
