#include "slm/data/graph_docs.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "slm/data/shards.h"
#include "slm/data/tokenizer.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::data {

namespace fs = std::filesystem;

std::string graph_piece(const FunctionInfo& f) {
  return f.file + ":" + std::to_string(f.line) + "\n" + f.text + "\n";
}

namespace {

// Hashes of the distinct identifiers (3+ characters) of a text, sorted: the "names" two functions share.
std::vector<uint64_t> identifier_set(const std::string& text) {
  std::vector<uint64_t> out;
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (std::isalpha(c) || c == '_') {
      size_t j = i + 1;
      uint64_t h = 1469598103934665603ull;  // FNV-1a
      h = (h ^ c) * 1099511628211ull;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) {
        h = (h ^ static_cast<unsigned char>(text[j])) * 1099511628211ull;
        ++j;
      }
      if (j - i >= 3) out.push_back(h);
      i = j;
    } else {
      ++i;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

size_t shared_count(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  size_t n = 0, i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j])
      ++n, ++i, ++j;
    else if (a[i] < b[j])
      ++i;
    else
      ++j;
  }
  return n;
}

}  // namespace

std::vector<GraphDocument> plan_graph_documents(const CallGraph& g, const std::vector<uint64_t>& piece_tokens,
                                                const GraphDocOptions& o, GraphDocStats* stats) {
  const size_t n = g.functions.size();
  if (piece_tokens.size() != n) throw Error("graphs: piece token counts do not match the functions");
  if (o.budget < kGraphDocOverhead + 2) throw Error("graphs: --budget " + std::to_string(o.budget) + " is too small");
  GraphDocStats st;
  std::vector<std::vector<uint64_t>> names(n);
  std::vector<bool> have_names(n, false);
  auto names_of = [&](uint32_t i) -> const std::vector<uint64_t>& {
    if (!have_names[i]) names[i] = identifier_set(g.functions[i].text), have_names[i] = true;
    return names[i];
  };
  auto cost = [&](uint32_t i) { return piece_tokens[i] + 1; };  // + its <|file|> marker

  struct Candidate {
    uint32_t fn;
    int depth;
    bool caller;
    double related;
  };
  std::vector<GraphDocument> docs;
  std::vector<int> seen(n, -1);  // per function: the target whose document last claimed it
  for (uint32_t t = 0; t < n; ++t) {
    std::vector<Candidate> cands;
    seen[t] = static_cast<int>(t);
    auto add = [&](uint32_t f, int depth, bool caller) {
      if (seen[f] == static_cast<int>(t)) return;
      seen[f] = static_cast<int>(t);
      cands.push_back({f, depth, caller, 0.0});
    };
    // Direct callers first, so a function that is both (mutual recursion) sits with the callers.
    for (uint32_t c : g.callers[t]) add(c, 1, true);
    for (uint32_t c : g.callees[t]) add(c, 1, false);
    const size_t direct = cands.size();
    if (o.depth >= 2)
      for (size_t k = 0; k < direct; ++k) {
        const auto& next = cands[k].caller ? g.callers[cands[k].fn] : g.callees[cands[k].fn];
        const bool caller = cands[k].caller;
        for (uint32_t c : next) add(c, 2, caller);
      }
    if (cands.empty() && !o.keep_isolated) {
      ++st.isolated;
      continue;
    }
    uint64_t total = kGraphDocOverhead + cost(t);
    if (total > o.budget) {
      ++st.too_large;
      continue;
    }
    // Relatedness: the share of a candidate's names that the target also uses.
    const auto& tn = names_of(t);
    for (auto& c : cands) {
      const auto& cn = names_of(c.fn);
      c.related = cn.empty() ? 0.0 : static_cast<double>(shared_count(cn, tn)) / static_cast<double>(cn.size());
    }
    std::sort(cands.begin(), cands.end(), [&](const Candidate& a, const Candidate& b) {
      if (a.depth != b.depth) return a.depth < b.depth;
      if (a.related != b.related) return a.related > b.related;
      if (cost(a.fn) != cost(b.fn)) return cost(a.fn) < cost(b.fn);
      return a.fn < b.fn;
    });
    GraphDocument d;
    d.target = t;
    std::vector<Candidate> kept;
    for (const auto& c : cands) {
      if (total + cost(c.fn) <= o.budget) {
        total += cost(c.fn);
        kept.push_back(c);
      } else {
        ++d.dropped;
      }
    }
    // Document order: callers lead into the target (farther first), callees lead away from it (nearer first);
    // within a distance, source order.
    auto by_place = [&](const Candidate& a, const Candidate& b, bool far_first) {
      if (a.depth != b.depth) return far_first ? a.depth > b.depth : a.depth < b.depth;
      const auto &fa = g.functions[a.fn], &fb = g.functions[b.fn];
      if (fa.file != fb.file) return fa.file < fb.file;
      return fa.line != fb.line ? fa.line < fb.line : a.fn < b.fn;
    };
    std::vector<Candidate> callers, callees;
    for (const auto& c : kept) (c.caller ? callers : callees).push_back(c);
    std::sort(callers.begin(), callers.end(), [&](auto& a, auto& b) { return by_place(a, b, true); });
    std::sort(callees.begin(), callees.end(), [&](auto& a, auto& b) { return by_place(a, b, false); });
    for (const auto& c : callers) d.callers.push_back(c.fn);
    for (const auto& c : callees) d.callees.push_back(c.fn);
    d.tokens = total;
    st.tokens += total;
    st.dropped_parts += d.dropped;
    ++st.documents;
    docs.push_back(std::move(d));
  }
  if (stats) *stats = st;
  return docs;
}

std::vector<uint32_t> graph_document_ids(const GraphDocument& d, const std::vector<std::vector<uint32_t>>& piece_ids,
                                         const Tokenizer& tok) {
  const uint32_t file = tok.special_id("<|file|>");
  std::vector<uint32_t> ids{tok.bos_id(), tok.special_id("<|callers|>")};
  auto put = [&](uint32_t f) {
    ids.push_back(file);
    ids.insert(ids.end(), piece_ids[f].begin(), piece_ids[f].end());
  };
  for (uint32_t f : d.callers) put(f);
  ids.push_back(tok.special_id("<|target|>"));
  put(d.target);
  ids.push_back(tok.special_id("<|callees|>"));
  for (uint32_t f : d.callees) put(f);
  ids.push_back(tok.eos_id());
  return ids;
}

std::string graph_document_text(const CallGraph& g, const GraphDocument& d) {
  std::string out = "<|callers|>";
  auto put = [&](uint32_t f) { out += "<|file|>" + graph_piece(g.functions[f]); };
  for (uint32_t f : d.callers) put(f);
  out += "<|target|>";
  put(d.target);
  out += "<|callees|>";
  for (uint32_t f : d.callees) put(f);
  return out;
}

GraphBuildReport build_graph_documents(const GraphBuildOptions& o,
                                       const std::function<void(const std::string&, uint64_t, uint64_t)>& progress) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::error_code ec;
  // Inputs first, before any long work (build_call_graph repeats this check for its direct callers).
  if (!fs::is_directory(o.graph.src_dir, ec)) throw Error("graphs: source directory not found: " + o.graph.src_dir);
  if (!fs::is_regular_file(o.tokenizer, ec)) throw Error("graphs: tokenizer model not found: " + o.tokenizer);
  if (o.out.empty()) throw Error("graphs: name the output file (--out)");
  GraphBuildReport rep;
  rep.graph = build_call_graph(o.graph, [&](uint64_t done, uint64_t total) {
    if (progress) progress("parse", done, total);
  });
  rep.parse_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  CallGraph& g = rep.graph;
  const Tokenizer tok = Tokenizer::load(o.tokenizer);

  std::vector<std::vector<uint32_t>> piece_ids(g.functions.size());
  std::vector<uint64_t> piece_tokens(g.functions.size());
  for (size_t i = 0; i < g.functions.size(); ++i) {
    piece_ids[i] = tok.encode(graph_piece(g.functions[i]));
    piece_tokens[i] = piece_ids[i].size();
    if (progress && (i % 256 == 0 || i + 1 == g.functions.size())) progress("encode", i + 1, g.functions.size());
  }
  const auto docs = plan_graph_documents(g, piece_tokens, o.docs, &rep.docs);

  DocumentMeta meta;
  meta.package = o.package.empty() ? fs::path(o.graph.src_dir).lexically_normal().filename().string() : o.package;
  if (meta.package.empty())
    meta.package = fs::path(o.graph.src_dir).lexically_normal().parent_path().filename().string();
  meta.license = o.license;
  meta.domain = o.domain;

  make_parent_dirs(o.out);
  const std::string tmp = o.out + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  if (!out) throw Error(o.out + ": cannot write");
  std::unique_ptr<ShardWriter> shard;
  size_t shard_count = 0;
  const nlohmann::json extra = {{"tokenizer", fs::path(o.tokenizer).filename().string()},
                                {"bos", true},
                                {"eos", true},
                                {"format", "context-graph"}};
  auto next_shard = [&] {
    if (shard) shard->close();
    make_dirs(o.shards);
    char name[32];
    std::snprintf(name, sizeof name, "graphs-%05zu.slmtok", shard_count++);
    shard = std::make_unique<ShardWriter>((fs::path(o.shards) / name).string(), tok.vocab_size(), extra);
  };
  constexpr uint64_t kMaxShardTokens = 64ull << 20;
  for (size_t k = 0; k < docs.size(); ++k) {
    const auto& d = docs[k];
    const FunctionInfo& t = g.functions[d.target];
    meta.path = t.file;
    nlohmann::json j = meta.to_json();
    j["target"] = t.signature();
    j["line"] = t.line;
    j["tokens"] = d.tokens;
    auto sigs = [&](const std::vector<uint32_t>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (uint32_t f : v) a.push_back(g.functions[f].signature());
      return a;
    };
    j["callers"] = sigs(d.callers);
    j["callees"] = sigs(d.callees);
    j["text"] = graph_document_text(g, d);
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    if (!o.shards.empty()) {
      const auto ids = graph_document_ids(d, piece_ids, tok);
      if (!shard || (shard->token_count() > 0 && shard->token_count() + ids.size() > kMaxShardTokens)) next_shard();
      shard->add_document(ids, meta);
    }
    if (progress && (k % 256 == 0 || k + 1 == docs.size())) progress("write", k + 1, docs.size());
  }
  if (shard) shard->close();
  out.close();
  if (!out) throw Error(o.out + ": write failed");
  if (std::rename(tmp.c_str(), o.out.c_str()) != 0) throw Error(o.out + ": cannot rename " + tmp);
  for (auto& f : g.functions) std::string().swap(f.text);
  rep.total_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return rep;
}

}  // namespace slm::data
