// slm data graphs: Callers -> Target -> Callees documents from a C++ source tree (docs/context-graphs.md).
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/data/corpus_graphs.h"
#include "slm/data/graph_docs.h"
#include "slm/util/error.h"
#include "slm/util/progress.h"

namespace slm::cli {

void add_data_graphs_command(CLI::App* data) {
  static data::GraphBuildOptions o;
  o.tokenizer = "tokenizer/slm-code-32k.model";
  auto* g = data->add_subcommand("graphs", "Context-graph documents (callers, target, callees) from C++ sources");
  static std::string corpus;
  static double parse_budget = data::CorpusGraphOptions{}.package_parse_budget_s;
  g->add_option("--src", o.graph.src_dir, "C++ source directory (scanned recursively)");
  g->add_option("--out", o.out, "output .jsonl (one document per target; with --src)");
  g->add_option("--corpus", corpus,
                "instead of --src: a corpus from slm data build; each package's cpp files of each split become one "
                "graph, written as <shards>/cpp-graphs/<split>-NNNNN.slmtok (needs --shards)");
  g->add_option("--parse-budget", parse_budget,
                "with --corpus: seconds of parsing per package, after which its remaining files stay whole files "
                "only (0: no limit)")
      ->capture_default_str();
  g->add_option("--budget", o.docs.budget, "tokens per document, BOS/EOS included (tiny recipes: e.g. 2048)")
      ->capture_default_str();
  g->add_option("--depth", o.docs.depth, "1: direct callers/callees only; 2: their callers/callees fill the rest")
      ->capture_default_str()
      ->check(CLI::Range(1, 2));
  g->add_option("--tokenizer", o.tokenizer, "tokenizer .model (counts the budget)")->capture_default_str();
  g->add_option("--shards", o.shards, "also write the exact token ids (section markers as special tokens) here");
  g->add_option("--package", o.package, "provenance: package name (default: the source directory's name)");
  g->add_option("--license", o.license, "provenance: license of the sources");
  g->add_option("--exclude", o.graph.exclude, "skip paths containing this substring (repeatable)");
  g->add_flag("--keep-isolated", o.docs.keep_isolated, "also emit functions that call and are called by nothing");
  g->callback([] {
    if (!corpus.empty()) {
      if (!o.graph.src_dir.empty()) throw Error("graphs: give --src or --corpus, not both");
      data::CorpusGraphOptions co;
      co.corpus_dir = corpus;
      co.shards_dir = o.shards;
      co.tokenizer = o.tokenizer;
      co.docs = o.docs;
      co.package_parse_budget_s = parse_budget;
      ProgressBar bar(std::cerr, "graphs", 0, "packages");
      const auto r = data::build_corpus_graphs(co, bar.callback());
      bar.finish();
      uint64_t tokens = 0;
      for (const auto& [_, t] : r.split_tokens) tokens += t;
      std::cout << "| packages | files | functions | edges | documents | tokens | train / validation / test tokens | "
                   "isolated (skipped) | too large (skipped) | files not parsed |\n"
                   "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n";
      auto at = [&](const char* s) { return r.split_tokens.count(s) ? r.split_tokens.at(s) : uint64_t{0}; };
      std::cout << "| " << r.packages << " | " << r.files << " | " << r.functions << " | " << r.edges << " | "
                << r.docs.documents << " | " << tokens << " | " << at("train") << " / " << at("validation") << " / "
                << at("test") << " | " << r.docs.isolated << " | " << r.docs.too_large << " | " << r.files_skipped
                << " |\n";
      if (r.whole_file_tokens)
        std::printf(
            "mix: %.1f%% of the C++ tokens are graph documents, %.1f%% whole files (cpp domain)\n",
            100.0 * static_cast<double>(tokens) / static_cast<double>(tokens + r.whole_file_tokens),
            100.0 * static_cast<double>(r.whole_file_tokens) / static_cast<double>(tokens + r.whole_file_tokens));
      std::cout << "wrote " << co.shards_dir << "/" << co.domain << "/{train,validation,test}-NNNNN.slmtok\n";
      return;
    }
    if (o.graph.src_dir.empty() || o.out.empty()) throw Error("graphs: give --src DIR and --out FILE (or --corpus)");
    std::unique_ptr<ProgressBar> bar;
    std::string phase;
    auto rep = data::build_graph_documents(o, [&](const std::string& ph, uint64_t done, uint64_t total) {
      if (ph != phase) {
        if (bar) bar->finish();
        phase = ph;
        bar = std::make_unique<ProgressBar>(std::cerr, ph, total,
                                            ph == "parse"    ? "B"
                                            : ph == "encode" ? "functions"
                                                             : "docs");
      }
      bar->update(done);
    });
    if (bar) bar->finish();
    for (const auto& w : rep.graph.warnings) std::cerr << "slm: warning: " << w << "\n";
    const auto& gr = rep.graph;
    const auto& d = rep.docs;
    char mean[32];
    std::snprintf(mean, sizeof mean, "%.1f",
                  d.documents ? static_cast<double>(d.tokens) / static_cast<double>(d.documents) : 0.0);
    std::cout
        << "| files | skipped | with parse errors | MB | functions | call sites | resolved | ambiguous | edges |\n"
        << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        << "| " << gr.files << " | " << gr.files_skipped << " | " << gr.files_with_errors << " | "
        << static_cast<double>(gr.bytes) / 1e6 << " | " << gr.functions.size() << " | " << gr.call_sites << " | "
        << gr.resolved_call_sites << " | " << gr.ambiguous_call_sites << " | " << gr.edge_count() << " |\n\n"
        << "| documents | isolated (skipped) | too large (skipped) | tokens | mean tokens/doc | parts dropped for "
           "budget | parse s | total s |\n"
        << "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        << "| " << d.documents << " | " << d.isolated << " | " << d.too_large << " | " << d.tokens << " | " << mean
        << " | " << d.dropped_parts << " | " << rep.parse_seconds << " | " << rep.total_seconds << " |\n";
    std::cout << "wrote " << o.out << (o.shards.empty() ? "" : " and " + o.shards + "/graphs-*.slmtok") << "\n";
  });
}

}  // namespace slm::cli
