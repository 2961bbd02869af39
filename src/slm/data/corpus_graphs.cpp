#include "slm/data/corpus_graphs.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <unordered_map>

#include "slm/data/callgraph.h"
#include "slm/data/shards.h"
#include "slm/data/text.h"
#include "slm/data/tokenizer.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::data {

namespace {

// One split's shards, rolled over at max_tokens.
class SplitShards {
 public:
  SplitShards(std::string dir, std::string split, uint64_t vocab, nlohmann::json extra, uint64_t max_tokens)
      : dir_(std::move(dir)), split_(std::move(split)), vocab_(vocab), extra_(std::move(extra)), max_(max_tokens) {}
  void add(const std::vector<uint32_t>& ids, const DocumentMeta& meta) {
    if (!w_ || (w_->token_count() > 0 && w_->token_count() + ids.size() > max_)) {
      if (w_) w_->close();
      char name[64];
      std::snprintf(name, sizeof name, "/%s-%05zu.slmtok", split_.c_str(), count_++);
      make_dirs(dir_);
      w_ = std::make_unique<ShardWriter>(dir_ + name, vocab_, extra_);
    }
    w_->add_document(ids, meta);
  }
  void close() {
    if (w_) w_->close();
  }

 private:
  std::string dir_, split_;
  uint64_t vocab_;
  nlohmann::json extra_;
  uint64_t max_;
  size_t count_ = 0;
  std::unique_ptr<ShardWriter> w_;
};

}  // namespace

CorpusGraphReport build_corpus_graphs(const CorpusGraphOptions& o,
                                      const std::function<void(uint64_t, uint64_t)>& progress) {
  if (o.shards_dir.empty()) throw Error("graphs: name the shard directory (--shards)");
  const Tokenizer tok = Tokenizer::load(o.tokenizer);
  CorpusGraphReport rep;
  {
    std::ifstream rj(o.corpus_dir + "/report.json");
    const auto j = nlohmann::json::parse(rj, nullptr, false);
    if (!j.is_discarded() && j.contains("domains"))
      for (const auto& d : j["domains"])
        if (d.value("domain", "") == "cpp") rep.whole_file_tokens = d.value("tokens", uint64_t{0});
  }
  const nlohmann::json extra = {{"tokenizer", std::filesystem::path(o.tokenizer).filename().string()},
                                {"bos", true},
                                {"eos", true},
                                {"format", "context-graph"}};
  bool any_input = false;
  for (const char* split : {"train", "validation", "test"}) {
    const std::string in = o.corpus_dir + "/cpp/" + split + ".jsonl";
    if (!std::ifstream(in)) continue;
    any_input = true;
    SplitShards out(o.shards_dir + "/" + o.domain, split, tok.vocab_size(), extra, o.max_shard_tokens);
    // Documents of one package are contiguous in the corpus (it is written root by root); each run of them is one
    // source tree.
    std::string package;
    std::vector<std::pair<std::string, std::string>> files;
    std::unordered_map<std::string, std::string> license_of;
    auto flush = [&] {
      if (files.empty()) return;
      ++rep.packages;
      rep.files += files.size();
      CallGraph g;
      try {
        CallGraphOptions go;
        go.time_budget_s = o.package_parse_budget_s;
        g = build_call_graph(files, go);
      } catch (const Error&) {
        files.clear();  // nothing parseable: the whole files still stand in the cpp domain
        return;
      }
      rep.functions += g.functions.size();
      rep.files_skipped += g.files_skipped;
      rep.edges += g.edge_count();
      std::vector<std::vector<uint32_t>> piece_ids(g.functions.size());
      std::vector<uint64_t> piece_tokens(g.functions.size());
      for (size_t i = 0; i < g.functions.size(); ++i) {
        piece_ids[i] = tok.encode(graph_piece(g.functions[i]));
        piece_tokens[i] = piece_ids[i].size();
      }
      GraphDocStats st;
      for (const auto& d : plan_graph_documents(g, piece_tokens, o.docs, &st)) {
        const FunctionInfo& t = g.functions[d.target];
        DocumentMeta meta{package, t.file, license_of[t.file], o.domain};
        const auto ids = graph_document_ids(d, piece_ids, tok);
        out.add(ids, meta);
        ++rep.split_documents[split];
        rep.split_tokens[split] += ids.size();
      }
      rep.docs.documents += st.documents;
      rep.docs.tokens += st.tokens;
      rep.docs.dropped_parts += st.dropped_parts;
      rep.docs.too_large += st.too_large;
      rep.docs.isolated += st.isolated;
      files.clear();
      license_of.clear();
      if (progress) progress(rep.packages, rep.packages);
    };
    for_each_text_document({in}, [&](const TextDocument& d) {
      if (d.meta.package != package) {
        flush();
        package = d.meta.package;
      }
      files.emplace_back(d.meta.path, d.text);
      license_of[d.meta.path] = d.meta.license;
    });
    flush();
    out.close();
  }
  if (!any_input) throw Error(o.corpus_dir + "/cpp: no {train,validation,test}.jsonl (build it with slm data build)");
  return rep;
}

}  // namespace slm::data
