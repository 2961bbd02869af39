// slm data build | shard | inspect
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "slm/data/corpus.h"
#include "slm/data/data_card.h"
#include "slm/data/pack.h"
#include "slm/data/shard_builder.h"
#include "slm/data/shards.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/progress.h"

namespace slm::cli {

namespace {

namespace fs = std::filesystem;

// The evaluation problems that must never enter a corpus (relative to the repository root).
constexpr const char* kDefaultEval = "../shared/eval/multipl-e/humaneval-cpp.jsonl";
constexpr const char* kDefaultTokenizer = "tokenizer/slm-code-32k.model";

struct BuildFlags {
  std::vector<std::string> domains;
  bool all = false;
  std::string out;
  double max_mb = 0;
  double max_file_mb = 1.0;
  double val = 0.01, test = 0.01;
  std::string eval = kDefaultEval;
  bool no_decontam = false;
  std::string tokenizer = kDefaultTokenizer;
  bool no_tokens = false;
  double near = 0.8;
  std::vector<std::string> source_dirs;
  std::string licenses = "recipes/data/debian.json";
  int jobs = 2;
  int debug_variants = 6;
  int review_files = 8;
  bool router_unbalanced_train = false;
  uint64_t router_max_per_domain = data::RouterOptions{}.max_per_domain;
};

void run_build(const BuildFlags& f) {
  data::CorpusOptions o;
  if (f.all) o.domains = data::implemented_domains();
  for (const auto& d : f.domains) {
    // Accept "cpp,cmake" as well as repeated flags.
    size_t p = 0;
    while (p <= d.size()) {
      size_t e = d.find(',', p);
      if (e == std::string::npos) e = d.size();
      if (e > p) o.domains.push_back(d.substr(p, e - p));
      p = e + 1;
    }
  }
  if (o.domains.empty())
    throw Error(
        "data build: name --domain D (cpp, cmake, shell, debug, review, design, algorithm, orchestration) or --all");
  o.out_dir = f.out;
  o.max_bytes_per_domain = static_cast<uint64_t>(f.max_mb * 1e6);
  o.max_file_bytes = static_cast<uint64_t>(f.max_file_mb * 1e6);
  o.validation_fraction = f.val;
  o.test_fraction = f.test;
  o.minhash.threshold = f.near;
  o.jobs = o.debug.jobs = o.review.jobs = f.jobs;
  o.debug.variants = f.debug_variants;
  o.review.files_per_root = f.review_files;
  o.router.balance_train = !f.router_unbalanced_train;
  o.router.max_per_domain = f.router_max_per_domain;
  if (!f.no_decontam) {
    if (!fs::exists(f.eval))
      throw Error(f.eval + ": evaluation problems not found (needed for decontamination; --no-decontam to skip)");
    o.eval_jsonl = f.eval;
  }
  if (!f.no_tokens && fs::exists(f.tokenizer)) o.tokenizer = f.tokenizer;
  if (!f.source_dirs.empty()) {
    // The patches of the source packages feed debug and review, under the same license policy as the fetch.
    const auto cfg = nlohmann::json::parse(read_file(f.licenses), nullptr, false);
    if (cfg.is_discarded() || !cfg.contains("licenses"))
      throw Error(f.licenses + ": expected a JSON object with \"licenses\" (see recipes/data/debian.json)");
    o.patch_licenses = data::LicensePolicy::from_json(cfg["licenses"], f.licenses + ": licenses");
    for (const auto& sd : f.source_dirs) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(sd, ec))
        if (e.is_directory() && fs::exists(e.path() / "debian" / "control")) o.source_packages.push_back(e.path());
      if (ec) throw Error(sd + ": cannot list the source directory: " + ec.message());
    }
    std::sort(o.source_packages.begin(), o.source_packages.end());
  }
  for (const auto& d : o.domains) {
    auto roots = data::default_roots(d);
    // Unpacked Debian source packages (slm data fetch, scripts/data-deps.sh): the code domains' classifiers look at
    // each one, and design takes the projects' own documentation (READMEs, Markdown, reStructuredText, doc/ pages),
    // not their test data, build files or vendored copies.
    // The algorithm domain's path rule applies to the packages too, and its files belong to no other domain.
    const bool from_sources = d == "cpp" || d == "cmake" || d == "shell" || d == "design" || d == "algorithm";
    std::vector<std::string> exclude =
        d == "design" ? std::vector<std::string>{"/debian/",   "CMakeLists.txt", "/test/",        "/tests/",
                                                 "/testdata/", "/testsuite/",    "/third_party/", "/3rdparty/",
                                                 "/vendor/",   "LICENSE",        "COPYING",       "/po/"}
                      : std::vector<std::string>{"/debian/"};
    if (d == "cpp" || d == "design")
      exclude.insert(exclude.end(), data::algorithm_paths().begin(), data::algorithm_paths().end());
    for (const auto& sd : from_sources ? f.source_dirs : std::vector<std::string>{}) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(sd, ec))
        if (e.is_directory()) roots.push_back({e.path().string(), "", "", false, exclude, ""});
    }
    o.roots[d] = roots;
  }
  std::unique_ptr<ProgressBar> bar;
  std::string phase;
  auto rep = data::build_corpus(o, [&](const std::string& ph, uint64_t done, uint64_t total) {
    if (ph != phase) {
      if (bar) bar->finish();
      phase = ph;
      bar = std::make_unique<ProgressBar>(std::cerr, ph, total,
                                          ph == "read"                 ? "B"
                                          : ph.starts_with("generate") ? "samples"
                                                                       : "files");
    }
    bar->set_total(total);
    bar->update(done);
  });
  if (bar) bar->finish();
  for (const auto& d : rep.domains) {
    for (const auto& m : d.missing_roots)
      std::cerr << "slm: note: " << d.domain << ": source not installed: " << m << "\n";
    if (!d.generator.empty()) std::cerr << "slm: " << d.domain << " generator: " << d.generator.dump() << "\n";
  }
  std::cout << rep.table();
  std::cout << "wrote " << o.out_dir << "/<domain>/{train,validation,test}.jsonl and " << o.out_dir
            << "/report.json (every removed document with its reason)\n";
}

}  // namespace

void add_data_graphs_command(CLI::App* data);  // cmd_data_graphs.cpp
void add_data_fetch_command(CLI::App* data);   // cmd_data_fetch.cpp

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Build domain corpora and token shards");
  data->require_subcommand(1);
  add_data_graphs_command(data);
  add_data_fetch_command(data);

  static BuildFlags bf;
  auto* build = data->add_subcommand("build", "Build deduplicated, decontaminated, split corpora from local sources");
  build->add_option("--domain", bf.domains,
                    "domain(s): cpp, cmake, shell, debug, review, design, algorithm, orchestration (comma-separated or "
                    "repeated; orchestration alone reads the others from --out)");
  build->add_flag("--all", bf.all, "every implemented domain");
  build->add_option("--out", bf.out, "output directory")->required();
  build->add_option("--max-mb", bf.max_mb, "cap each domain at about this many MB (sampled by path hash); 0 = all")
      ->capture_default_str();
  build->add_option("--max-file-mb", bf.max_file_mb, "skip files larger than this (generated code)")
      ->capture_default_str();
  build->add_option("--val", bf.val, "validation fraction (by source file)")->capture_default_str();
  build->add_option("--test", bf.test, "test fraction (by source file)")->capture_default_str();
  build->add_option("--near", bf.near, "near-duplicate threshold (estimated Jaccard of token 5-shingles)")
      ->capture_default_str();
  build->add_option("--eval", bf.eval, "evaluation problems to decontaminate against")->capture_default_str();
  build->add_flag("--no-decontam", bf.no_decontam, "skip decontamination");
  build->add_option("--tokenizer", bf.tokenizer, "tokenizer for the token counts (skipped when missing)")
      ->capture_default_str();
  build->add_flag("--no-tokens", bf.no_tokens, "do not count tokens");
  build->add_option("--source-dir", bf.source_dirs,
                    "directory of unpacked Debian source packages (slm data fetch): code, documentation and patches");
  build->add_option("--licenses", bf.licenses, "license policy for the source packages' patches (JSON, \"licenses\")")
      ->capture_default_str();
  build->add_option("--jobs", bf.jobs, "threads for document conversion and the debug/review generators")
      ->capture_default_str();
  build
      ->add_option("--debug-variants", bf.debug_variants,
                   "debug: variants (names, types, sizes) per bug program; 0: none (only source packages' patches)")
      ->capture_default_str();
  build
      ->add_option("--review-files", bf.review_files,
                   "review: files per source directory (chosen by path hash); 0: none")
      ->capture_default_str();
  build
      ->add_flag("--router-unbalanced-train", bf.router_unbalanced_train,
                 "orchestration: the train split keeps each domain's requests (up to the cap) instead of trimming "
                 "every domain to the smallest one's count; `slm router train` weights the labels instead")
      ->capture_default_str();
  build
      ->add_option("--router-max-per-domain", bf.router_max_per_domain,
                   "orchestration: at most this many requests per domain and split")
      ->capture_default_str();
  build->callback([] { run_build(bf); });

  static data::ShardBuildOptions so;
  static data::DataCardOptions card;
  static std::string card_out;
  auto* cards = data->add_subcommand(
      "card",
      "Data cards of a built corpus: per domain its size by split, packages, licenses, what the build removed "
      "and an example (Markdown)");
  cards->add_option("--corpus", card.corpus_dir, "slm data build's output directory")->required();
  cards->add_option("--out", card_out, "write the Markdown here (default: standard output)");
  cards->add_option("--top", card.top, "packages and licenses named per domain")->capture_default_str();
  cards->callback([] {
    const std::string md = data::data_cards_markdown(data::data_cards(card));
    if (card_out.empty())
      std::cout << md;
    else
      write_file_atomic(card_out, md);
  });

  auto* shard =
      data->add_subcommand("shard", "Tokenize corpora or text into token shards (BOS + tokens + EOS per document)");
  shard->alias("shards");
  shard->add_option("--input", so.inputs, "corpus directories, .jsonl files, text files or directories")->required();
  so.tokenizer = kDefaultTokenizer;
  shard->add_option("--tokenizer", so.tokenizer, "tokenizer .model")->capture_default_str();
  shard->add_option("--out", so.out_dir, "output directory")->required();
  shard->add_option("--name", so.name, "shard prefix for non-corpus inputs")->capture_default_str();
  shard->add_option("--max-shard-tokens", so.max_shard_tokens, "tokens per shard file")->capture_default_str();
  shard->callback([] {
    ProgressBar bar(std::cerr, "tokenize", 0, "B");
    auto groups = data::build_shards(so, bar.callback());
    bar.finish();
    std::cout << "| group | documents | bytes | tokens | bytes/token | shards |\n|---|---:|---:|---:|---:|---:|\n";
    for (const auto& g : groups) {
      char bpt[32];
      std::snprintf(bpt, sizeof bpt, "%.3f",
                    g.tokens ? static_cast<double>(g.bytes) / static_cast<double>(g.tokens) : 0.0);
      std::cout << "| " << g.name << " | " << g.documents << " | " << g.bytes << " | " << g.tokens << " | " << bpt
                << " | " << g.shards.size() << " |\n";
    }
  });

  static data::PackOptions po;
  auto* pack = data->add_subcommand(
      "pack", "Compressed, checksummed packs of token shards for the GPU machine (slm train --data X.slmpack)");
  pack->add_option("--input", po.shard_dir, "shard directory (slm data shard)")->required();
  pack->add_option("--out", po.out_dir, "output directory: <name>-NNNNN.slmpack and packs.json")->required();
  pack->add_option("--name", po.name, "pack file prefix")->capture_default_str();
  static double max_mib = 60;
  pack->add_option("--max-mib", max_mib, "largest pack in MiB (a GPU call carries 64 MiB in all)")
      ->capture_default_str();
  pack->add_option("--preset", po.preset, "xz preset, 0 (fast) to 9 (small)")->capture_default_str();
  pack->add_option("--jobs", po.jobs, "shards compressed at once")->capture_default_str();
  pack->callback([] {
    po.max_pack_bytes = static_cast<uint64_t>(max_mib * (1 << 20));
    ProgressBar bar(std::cerr, "pack", 0, "B");
    const auto packs = data::write_packs(po, bar.callback());
    bar.finish();
    std::cout << "| pack | MiB | tokens | tokens per MiB | raw / packed | files |\n|---|---:|---:|---:|---:|---:|\n";
    uint64_t bytes = 0, raw = 0, tokens = 0;
    for (const auto& p : packs) {
      const double mib = static_cast<double>(p.bytes) / (1 << 20);
      std::printf("| %s | %.1f | %llu | %.0f | %.2f | %zu |\n", p.file.c_str(), mib,
                  static_cast<unsigned long long>(p.tokens), static_cast<double>(p.tokens) / mib,
                  static_cast<double>(p.raw_bytes) / static_cast<double>(p.bytes), p.members.size());
      bytes += p.bytes, raw += p.raw_bytes, tokens += p.tokens;
    }
    std::printf("%zu packs, %.1f MiB, %llu tokens (%.0f per MiB); list with SHA-256 in %s/packs.json\n", packs.size(),
                static_cast<double>(bytes) / (1 << 20), static_cast<unsigned long long>(tokens),
                bytes ? static_cast<double>(tokens) / (static_cast<double>(bytes) / (1 << 20)) : 0.0,
                po.out_dir.c_str());
  });

  static std::vector<std::string> inspect_paths;
  auto* inspect = data->add_subcommand("inspect", "Verify token shards and print their headers");
  inspect->add_option("shards", inspect_paths, "shard files or directories")->required();
  inspect->callback([] {
    for (const auto& in : inspect_paths)
      for (const auto& p : data::list_shards(in)) {
        auto s = data::Shard::open(p, /*verify=*/true);
        s->metadata();  // checks the sidecar too
        std::cout << p << ": ok, " << data::dtype_name(s->dtype()) << ", vocab " << s->vocab_size() << ", "
                  << s->token_count() << " tokens, " << s->doc_count() << " documents\n";
      }
  });
}

}  // namespace slm::cli
