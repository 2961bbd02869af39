#include "slm/train/evaluate.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "slm/data/shards.h"
#include "slm/model/weights.h"
#include "slm/recipe/recipe.h"
#include "slm/train/checkpoint.h"
#include "slm/util/autocast.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::train {

namespace {

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// "train" for "train-00003.slmtok": the name before "-<digits>.slmtok", as slm data shard numbers its files; "" for
// any other file name.
std::string shard_prefix(const std::string& file) {
  const std::string ext = data::kShardExtension;
  if (file.size() <= ext.size() || file.compare(file.size() - ext.size(), ext.size(), ext) != 0) return "";
  const std::string stem = file.substr(0, file.size() - ext.size());
  const auto dash = stem.rfind('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == stem.size()) return "";
  for (size_t i = dash + 1; i < stem.size(); ++i)
    if (stem[i] < '0' || stem[i] > '9') return "";
  return stem.substr(0, dash);
}

}  // namespace

std::vector<DomainShards> find_domains(const std::string& data_dir, const std::vector<std::string>& domains) {
  if (!is_dir(data_dir)) throw Error(data_dir + ": no such shard directory (build one with `slm data shard`)");
  std::map<std::string, DomainShards> found, plain;
  for (const auto& entry : list_dir(data_dir)) {
    const std::string path = data_dir + "/" + entry;
    if (is_dir(path)) {
      DomainShards d{entry, {}};
      for (const auto& f : list_dir(path))
        if (auto split = shard_prefix(f); !split.empty()) d.splits[split].push_back(path + "/" + f);
      if (!d.splits.empty()) found[entry] = std::move(d);
    } else if (auto prefix = shard_prefix(entry); !prefix.empty()) {
      plain[prefix].name = prefix;
      plain[prefix].splits["train"].push_back(path);
    }
  }
  for (auto& [prefix, d] : plain) {
    if (found.count(prefix))
      throw Error(data_dir + ": the plain shards " + d.splits["train"].front() + " and the domain directory " +
                  data_dir + "/" + prefix + " would both be domain '" + prefix + "'; move one of them");
    found[prefix] = std::move(d);
  }
  std::vector<DomainShards> out;
  if (domains.empty()) {
    for (auto& [_, d] : found) out.push_back(std::move(d));
  } else {
    for (const auto& name : domains)
      if (auto it = found.find(name); it != found.end()) out.push_back(it->second);
  }
  return out;
}

uint64_t held_out_start(const std::vector<std::string>& train_shards, uint64_t window_tokens) {
  std::vector<std::shared_ptr<const data::Shard>> shards;
  uint64_t total = 0;
  for (const auto& path : train_shards) {
    shards.push_back(data::Shard::open(path, /*verify=*/false));
    total += shards.back()->token_count();
  }
  const uint64_t want = std::max<uint64_t>((total + 99) / 100, window_tokens);
  if (total < want + window_tokens) return 0;
  const uint64_t latest = total - want;  // the held-out part starts here or earlier
  // The start of the document holding token `latest`; every shard starts a document.
  uint64_t boundary = 0, start = 0;
  for (const auto& sh : shards) {
    if (latest < start + sh->token_count()) {
      boundary = start + sh->doc_begin(sh->doc_at(latest - start));
      break;
    }
    start += sh->token_count();
  }
  if (total - boundary > 2 * want || boundary < window_tokens) return latest;
  return boundary;
}

std::vector<data::ShardSource> split_sources(const std::string& data_dir, const std::string& split,
                                             const std::vector<std::string>& domains, uint64_t window_tokens) {
  std::vector<data::ShardSource> out;
  for (const auto& d : find_domains(data_dir, domains)) {
    const auto train = d.splits.find("train");
    if ((split == "train" || split == "validation") && train != d.splits.end() && !d.splits.count("validation")) {
      const uint64_t cut = held_out_start(train->second, window_tokens);
      if (split == "train")
        out.push_back({d.name, train->second, 1.0, 0, cut > 0 ? cut : data::ShardSource::kToEnd});
      else if (cut > 0)
        out.push_back({d.name, train->second, 1.0, cut, data::ShardSource::kToEnd});
      continue;
    }
    if (auto it = d.splits.find(split); it != d.splits.end()) out.push_back({d.name, it->second, 1.0});
  }
  return out;
}

std::string shard_tokenizer(const std::string& shard_path) {
  auto extra = data::Shard::open(shard_path, /*verify=*/false)->sidecar().value("extra", nlohmann::json());
  const std::string name = extra.is_object() ? extra.value("tokenizer", "") : "";
  if (!name.empty() && ::access(("tokenizer/" + name).c_str(), R_OK) == 0) return "tokenizer/" + name;
  return "";
}

std::string run_tokenizer(const nlohmann::json& run_config, const std::string& data_dir, const std::string& split) {
  const std::string named = run_config.is_object() ? run_config.value("tokenizer", "") : "";
  if (!named.empty()) return named;
  try {
    for (const auto& d : find_domains(data_dir, {})) {
      auto it = d.splits.find(split);
      if (it == d.splits.end() && split == "validation") it = d.splits.find("train");  // a held-out tail
      if (it != d.splits.end()) return shard_tokenizer(it->second.front());
    }
    return "";
  } catch (const Error&) {
    return "";  // the shards moved or cannot be read: no tokenizer is known
  }
}

std::string checkpoint_tokenizer(const std::string& checkpoint) {
  const std::string weights = model::weights_path(checkpoint);
  const std::string meta_path = weights.substr(0, weights.find_last_of('/') + 1) + "meta.json";
  if (weights.find('/') == std::string::npos || ::access(meta_path.c_str(), R_OK) != 0) return "";
  auto meta = nlohmann::json::parse(read_file(meta_path), nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("config") || !meta["config"].is_object()) return "";
  const auto& cfg = meta["config"];
  const std::string tokenizer = run_tokenizer(cfg, cfg.value("data", ""), "train");
  return tokenizer == "none" ? "" : tokenizer;
}

torch::Tensor token_byte_counts(const data::Tokenizer& tok, int64_t vocab_size) {
  auto out = torch::zeros({vocab_size}, torch::kDouble);
  auto acc = out.accessor<double, 1>();
  const int64_t n = std::min<int64_t>(vocab_size, tok.vocab_size());
  for (int64_t id = 0; id < n; ++id) acc[id] = static_cast<double>(tok.decode({static_cast<uint32_t>(id)}).size());
  return out;
}

std::map<std::string, DomainScore> evaluate_model(model::HybridLM& model, const std::vector<data::ShardSource>& sources,
                                                  const EvalWindows& windows, const torch::Tensor& token_bytes,
                                                  torch::Device device) {
  std::map<std::string, DomainScore> out;
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  for (const auto& src : sources) {
    data::LoaderOptions lo;
    lo.batch_size = windows.batch;
    lo.seq_len = windows.seq_len;
    lo.seed = 0;  // the same windows at every evaluation
    lo.verify_checksums = false;
    data::TokenLoader loader({src}, lo);
    DomainScore s;
    double nll = 0, bytes = 0;
    int64_t count = 0;
    const int64_t available = static_cast<int64_t>((loader.windows(0) + windows.batch - 1) / windows.batch);
    const int64_t batches = std::max<int64_t>(1, std::min<int64_t>(windows.batches, available));
    for (int64_t b = 0; b < batches; ++b) {
      auto batch = loader.next();
      auto x = batch.tokens.narrow(1, 0, windows.seq_len).to(device);
      auto y = batch.tokens.narrow(1, 1, windows.seq_len);
      // float64 on the model's device: the [batch, seq, vocab] logits (1 GiB at 8 x 1024 x 32k) stay off the host.
      // Packed documents are scored each alone, as the trainer trains them.
      auto docs = model::documents_from_ids(batch.doc_ids.narrow(1, 0, windows.seq_len));
      if (docs) docs = model::to_device(*docs, device);
      auto logits = model.forward(x, docs ? &*docs : nullptr).logits.to(torch::kDouble);
      auto token_nll = torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(-1)}), y.reshape({-1}).to(device),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
      auto window_nll = token_nll.reshape({x.size(0), -1}).sum(1).cpu();
      auto window_bytes = token_bytes.defined()
                              ? token_bytes.index_select(0, y.reshape({-1})).reshape({x.size(0), -1}).sum(1)
                              : torch::zeros({x.size(0)}, torch::kDouble);
      for (int64_t w = 0; w < x.size(0); ++w) {
        s.window_nll.push_back(window_nll[w].item<double>());
        s.window_bytes.push_back(window_bytes[w].item<double>());
        if (windows.keep_tokens) {
          auto ids = batch.tokens[w].narrow(0, 0, windows.seq_len).contiguous();
          s.window_tokens.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
        }
      }
      nll += window_nll.sum().item<double>();
      count += token_nll.numel();
      bytes += window_bytes.sum().item<double>();
    }
    s.loss = nll / static_cast<double>(count);
    s.bpb = bytes > 0 ? nll / std::log(2.0) / bytes : std::nan("");
    s.tokens = count;
    s.bytes = bytes;
    s.batches = batches;
    out[src.name] = s;
  }
  model.train(was_training);
  return out;
}

DomainScore pooled(const std::map<std::string, DomainScore>& scores) {
  DomainScore all;
  double nll = 0;
  bool bytes_everywhere = !scores.empty();
  for (const auto& [_, s] : scores) {
    nll += s.loss * static_cast<double>(s.tokens);
    all.tokens += s.tokens;
    all.bytes += s.bytes;
    all.batches += s.batches;
    bytes_everywhere = bytes_everywhere && s.bytes > 0;
  }
  if (all.tokens > 0) all.loss = nll / static_cast<double>(all.tokens);
  if (bytes_everywhere) all.bpb = nll / std::log(2.0) / all.bytes;
  return all;
}

CheckpointScores evaluate_checkpoint(const CheckpointEval& req) {
  CheckpointScores out;
  Recipe recipe;
  nlohmann::json run = nlohmann::json::object();  // the training run's configuration, when there is one
  const std::string& path = req.checkpoint;
  if (path.empty()) throw Error("--checkpoint is required");
  if (::access(path.c_str(), F_OK) != 0) throw Error(path + ": no such checkpoint");
  const bool training = is_dir(path) && (::access((path + "/meta.json").c_str(), F_OK) == 0 ||
                                         ::access((path + "/latest").c_str(), F_OK) == 0);
  if (training) {
    // Verifies every tensor's checksum; the optimizer state is read too and dropped.
    const auto meta = load_checkpoint(path).meta;
    const std::string dir = meta.at("checkpoint_dir").get<std::string>();
    out.weights = dir + "/model.safetensors";
    out.step = meta.at("step").get<int64_t>();
    run = meta.value("config", nlohmann::json::object());
    recipe = req.recipe.empty() ? parse_recipe_text(meta.at("recipe_text").get<std::string>(), dir + "/meta.json")
                                : load_recipe(req.recipe);
  } else {
    out.weights = model::weights_path(path);
    if (req.recipe.empty())
      throw Error(path + ": a weights file does not record its recipe; give the recipe it was trained from (--recipe)");
    recipe = load_recipe(req.recipe);
  }
  out.recipe = recipe.name;

  const std::string data = !req.data.empty() ? req.data : run.value("data", "");
  if (data.empty()) throw Error(path + ": give the shard directory (--data)");
  auto setting = [&](int64_t given, const char* key, int64_t fallback) {
    if (given > 0) return given;
    const int64_t saved = run.value(key, int64_t{0});
    return saved > 0 ? saved : fallback;
  };
  out.windows.batch = setting(req.batch, "batch", 8);
  out.windows.seq_len = setting(req.seq_len, "seq_len", recipe.seq_len);
  out.windows.batches = setting(req.batches, "eval_batches", 4);
  out.windows.keep_tokens = req.keep_tokens;
  if (out.windows.seq_len < 2) throw Error("--seq-len must be >= 2");

  const auto domains = !req.domains.empty() ? req.domains : run.value("domains", std::vector<std::string>{});
  // A held-out tail depends on the window length (held_out_start): the training run's, whatever --seq-len says,
  // so that evaluation reads the tokens training held out.
  const auto trained_window = static_cast<uint64_t>(setting(0, "seq_len", recipe.seq_len)) + 1;
  auto sources = split_sources(data, req.split, domains, trained_window);
  for (const auto& d : domains)
    if (std::none_of(sources.begin(), sources.end(), [&](const auto& s) { return s.name == d; }))
      throw Error(data + "/" + d + ": domain '" + d + "' has no " + req.split + "-*.slmtok shards");
  if (sources.empty())
    throw Error(data + ": no <domain>/" + req.split + "-*.slmtok shards (the split '" + req.split +
                "' is missing; `slm data shard` of a corpus writes train, validation and test, of plain files "
                "training shards whose held-out tail is the validation split)");
  for (const auto& src : sources)
    for (const auto& shard : src.shards)
      if (data::Shard::open(shard, /*verify=*/false)->vocab_size() > static_cast<uint32_t>(recipe.vocab_size))
        throw Error(shard + ": shard vocabulary exceeds the vocab_size " + std::to_string(recipe.vocab_size) +
                    " of recipe " + recipe.name + "; the checkpoint was not trained on these shards");

  const std::string tokenizer = !req.tokenizer.empty() ? req.tokenizer : run_tokenizer(run, data, req.split);
  torch::Tensor token_bytes;
  if (!tokenizer.empty() && tokenizer != "none") {
    auto tok = data::Tokenizer::load(tokenizer);
    if (tok.vocab_size() > static_cast<uint32_t>(recipe.vocab_size))
      throw Error(tokenizer + ": vocabulary " + std::to_string(tok.vocab_size()) + " exceeds the vocab_size " +
                  std::to_string(recipe.vocab_size) + " of recipe " + recipe.name);
    token_bytes = token_byte_counts(tok, recipe.vocab_size);
    out.tokenizer = tokenizer;
  }

  const torch::Device device = parse_device(req.device);
  model::HybridLM m(recipe, torch::TensorOptions().dtype(torch::kFloat).device(device));
  model::load_weights(m, out.weights);
  out.nvfp4_weights = static_cast<int64_t>(model::nvfp4_weights(m).size());
  const AutocastScope bf16(device.type(), req.bf16);
  out.bf16 = req.bf16;
  out.domains = evaluate_model(m, sources, out.windows, token_bytes, device);
  out.all = pooled(out.domains);
  // The request is an upper bound: a split with fewer windows is scored in fewer batches.
  out.windows.batches = 0;
  for (const auto& [_, s] : out.domains) out.windows.batches = std::max(out.windows.batches, s.batches);
  return out;
}

}  // namespace slm::train
