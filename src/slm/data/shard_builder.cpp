#include "slm/data/shard_builder.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "slm/data/shards.h"
#include "slm/data/text.h"
#include "slm/data/tokenizer.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::data {

namespace fs = std::filesystem;

namespace {

struct GroupWriter {
  ShardGroup info;
  fs::path dir;
  std::string prefix;
  std::unique_ptr<ShardWriter> w;
};

// "<domain>/<split>" for <...>/<domain>/<split>.jsonl with a known split name, else "".
std::string corpus_group(const fs::path& p) {
  if (p.extension() != ".jsonl") return "";
  const std::string split = p.stem().string();
  if (split != "train" && split != "validation" && split != "test") return "";
  const std::string domain = p.parent_path().filename().string();
  return domain.empty() ? split : domain + "/" + split;
}

}  // namespace

std::vector<ShardGroup> build_shards(const ShardBuildOptions& o, const ProgressFn& progress) {
  if (o.inputs.empty()) throw Error("data shard: no inputs");
  if (o.out_dir.empty()) throw Error("data shard: no output directory");
  if (o.max_shard_tokens == 0) throw Error("data shard: max_shard_tokens must be positive");
  const Tokenizer tok = Tokenizer::load(o.tokenizer);
  // A directory that holds corpus .jsonl files contributes only those (not report.json and the like).
  std::vector<std::string> inputs;
  for (const auto& in : o.inputs) {
    std::error_code ec;
    std::vector<std::string> jsonl;
    if (fs::is_directory(in, ec))
      for (auto it = fs::recursive_directory_iterator(in, ec); it != fs::recursive_directory_iterator(); it.increment(ec))
        if (!ec && it->is_regular_file(ec) && it->path().extension() == ".jsonl") jsonl.push_back(it->path().string());
    std::sort(jsonl.begin(), jsonl.end());
    if (jsonl.empty()) inputs.push_back(in);
    else inputs.insert(inputs.end(), jsonl.begin(), jsonl.end());
  }
  const uint64_t total = text_input_bytes(inputs);
  uint64_t done = 0;
  std::map<std::string, GroupWriter> groups;
  std::vector<std::string> order;
  nlohmann::json extra = {{"tokenizer", fs::path(o.tokenizer).filename().string()},
                          {"bos", o.add_bos},
                          {"eos", o.add_eos}};

  auto next_shard = [&](GroupWriter& g) {
    if (g.w) g.w->close();
    char num[16];
    std::snprintf(num, sizeof num, "-%05zu", g.info.shards.size());
    make_dirs(g.dir.string());
    const std::string path = (g.dir / (g.prefix + num + kShardExtension)).string();
    g.w = std::make_unique<ShardWriter>(path, tok.vocab_size(), extra);
    g.info.shards.push_back(path);
  };

  for_each_text_document(inputs, [&](const TextDocument& d) {
    done += d.raw_bytes;
    std::string group;
    const std::string src = d.id.substr(0, d.id.rfind(':'));
    group = corpus_group(fs::path(d.id.find(".jsonl:") != std::string::npos ? src : d.id));
    if (group.empty()) group = o.name;
    auto [it, fresh] = groups.try_emplace(group);
    GroupWriter& g = it->second;
    if (fresh) {
      order.push_back(group);
      g.info.name = group;
      const auto slash = group.rfind('/');
      g.dir = slash == std::string::npos ? fs::path(o.out_dir) : fs::path(o.out_dir) / group.substr(0, slash);
      g.prefix = slash == std::string::npos ? group : group.substr(slash + 1);
    }
    std::vector<uint32_t> ids;
    if (o.add_bos) ids.push_back(tok.bos_id());
    auto body = tok.encode(d.text);
    ids.insert(ids.end(), body.begin(), body.end());
    if (o.add_eos) ids.push_back(tok.eos_id());
    if (!g.w || (g.w->token_count() > 0 && g.w->token_count() + ids.size() > o.max_shard_tokens)) next_shard(g);
    DocumentMeta meta = d.meta;
    if (meta.path.empty()) meta.path = d.id;
    g.w->add_document(ids, meta);
    ++g.info.documents;
    g.info.tokens += ids.size();
    g.info.bytes += d.text.size();
    if (progress) progress(done, total);
  });
  std::vector<ShardGroup> out;
  for (const auto& name : order) {
    auto& g = groups[name];
    if (g.w) g.w->close();
    out.push_back(g.info);
  }
  if (out.empty()) throw Error("data shard: the inputs hold no documents");
  return out;
}

}  // namespace slm::data
