#include "slm/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "slm/data/engram_canonical.h"
#include "slm/data/fim.h"
#include "slm/data/loader.h"
#include "slm/data/shards.h"
#include "slm/data/tokenizer.h"
#include "slm/io/run_dir.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/weights.h"
#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/recipe/recipe.h"
#include "slm/train/checkpoint.h"
#include "slm/train/device_batch.h"
#include "slm/train/distributed.h"
#include "slm/train/evaluate.h"
#include "slm/train/flops.h"
#include "slm/train/graph_step.h"
#include "slm/train/memory.h"
#include "slm/train/profile.h"
#include "slm/util/autocast.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::train {

namespace {

using Clock = std::chrono::steady_clock;

// One source per domain of cfg.data that has the split (train, validation; split_sources).
std::vector<data::ShardSource> find_sources(const TrainConfig& cfg, const std::string& split, int64_t seq_len) {
  std::vector<data::ShardSource> out = split_sources(cfg.data, split, cfg.domains, static_cast<uint64_t>(seq_len) + 1);
  if (split == "train")
    for (const auto& d : cfg.domains)
      if (std::none_of(out.begin(), out.end(), [&](const auto& s) { return s.name == d; }))
        throw Error(cfg.data + "/" + d + ": domain '" + d + "' has no " + split + "-*.slmtok shards");
  for (auto& src : out)
    if (auto w = cfg.mix.find(src.name); w != cfg.mix.end()) src.weight = w->second;
  for (const auto& [d, _] : cfg.mix)
    if (std::none_of(out.begin(), out.end(), [&](const auto& s) { return s.name == d; }) && split == "train")
      throw Error("--mix names domain '" + d + "', which has no train shards under " + cfg.data);
  if (out.empty() && split == "train")
    throw Error(cfg.data +
                ": no token shards: neither <prefix>-NNNNN.slmtok nor <domain>/train-NNNNN.slmtok (build "
                "them with `slm data shard`)");
  return out;
}

double now_s(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_duration(double s) {
  char buf[32];
  const long t = std::lround(s);
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

// Dense peak BF16 tensor FLOP/s by product name (vendor data sheets), for MFU.
double peak_flops_for(const std::string& device_name) {
  if (device_name.find("H100") != std::string::npos || device_name.find("H200") != std::string::npos) return 989.4e12;
  if (device_name.find("A100") != std::string::npos) return 312e12;
  return 0;
}

std::string cuda_device_name(int index) {
#ifdef SLM_WITH_CUDA
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, index) == cudaSuccess) return p.name;
#endif
  (void)index;
  return "";
}

// Bytes of memory on the device: the GPU's, or the machine's physical memory for the CPU.
double device_capacity(torch::Device device) {
#ifdef SLM_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device.index());
    size_t free = 0, total = 0;
    return cudaMemGetInfo(&free, &total) == cudaSuccess ? static_cast<double>(total) : 0;
  }
#endif
  if (device.is_cuda()) return 0;
  return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
}

// The message for the allocation failure e (is_out_of_memory) while training cfg on one of `workers` devices.
std::string out_of_memory_text(const std::exception& e, const TrainConfig& cfg, const Recipe& recipe, int64_t seq_len,
                               torch::Device device, int workers, const std::string& where) {
  OutOfMemoryContext c;
  c.where = where + " on " + device.str();
  c.recipe_file = cfg.recipe;
  c.batch = cfg.batch / workers;
  c.seq_len = seq_len;
  c.accum = cfg.accum;
  c.workers = workers;
  c.capacity = device_capacity(device);
  c.recompute = cfg.recompute;
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  c.allocator = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  return out_of_memory_message(training_memory(recipe, c.batch, seq_len, device.is_cuda()), c);
}

// Where the lines of ranks other than 0 go.
std::ostream& null_stream() {
  static std::ostream s(nullptr);
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Configuration

nlohmann::json TrainConfig::to_json() const {
  return {{"recipe", recipe},
          {"data", data},
          {"out", out},
          {"tokenizer", tokenizer},
          {"domains", domains},
          {"mix", mix},
          {"steps", steps},
          {"token_budget", token_budget},
          {"batch", batch},
          {"seq_len", seq_len},
          {"accum", accum},
          {"seed", seed},
          {"lr", lr.to_json()},
          {"grad_clip", grad_clip},
          {"max_bad_steps", max_bad_steps},
          {"eval_every", eval_every},
          {"eval_batches", eval_batches},
          {"checkpoint_every", checkpoint_every},
          {"keep_last", keep_last},
          {"log_every", log_every},
          {"dsa_warmup_steps", dsa_warmup_steps},
          {"device", device},
          {"peak_tflops", peak_tflops},
          {"max_minutes", max_minutes},
          {"bucket_elements", bucket_elements},
          {"expert_parallel", expert_parallel},
          {"recompute", recompute},
          {"profile_steps", profile_steps},
          {"cuda_graph", cuda_graph},
          {"init", init},
          {"fim_rate", fim_rate},
          {"fim_spm_rate", fim_spm_rate},
          {"fim_domains", fim_domains},
          {"optim", optim.to_json()}};
}

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  TrainConfig c;
  try {
    c.recipe = j.at("recipe").get<std::string>();
    c.data = j.at("data").get<std::string>();
    c.out = j.at("out").get<std::string>();
    c.tokenizer = j.at("tokenizer").get<std::string>();
    c.domains = j.at("domains").get<std::vector<std::string>>();
    c.mix = j.at("mix").get<std::map<std::string, double>>();
    c.steps = j.at("steps").get<int64_t>();
    c.token_budget = j.at("token_budget").get<int64_t>();
    c.batch = j.at("batch").get<int64_t>();
    c.seq_len = j.at("seq_len").get<int64_t>();
    c.accum = j.at("accum").get<int64_t>();
    c.seed = j.at("seed").get<uint64_t>();
    c.lr = LrSchedule::from_json(j.at("lr"), "train config lr");
    c.grad_clip = j.at("grad_clip").get<double>();
    c.max_bad_steps = j.at("max_bad_steps").get<int>();
    c.eval_every = j.at("eval_every").get<int64_t>();
    c.eval_batches = j.at("eval_batches").get<int64_t>();
    c.checkpoint_every = j.at("checkpoint_every").get<int64_t>();
    c.keep_last = j.at("keep_last").get<int>();
    c.log_every = j.at("log_every").get<int64_t>();
    c.dsa_warmup_steps = j.at("dsa_warmup_steps").get<int64_t>();
    c.device = j.at("device").get<std::string>();
    c.peak_tflops = j.at("peak_tflops").get<double>();
    c.max_minutes = j.at("max_minutes").get<double>();
    c.bucket_elements = j.value("bucket_elements", c.bucket_elements);
    c.expert_parallel = j.value("expert_parallel", c.expert_parallel);
    c.recompute = j.value("recompute", c.recompute);
    c.profile_steps = j.value("profile_steps", c.profile_steps);
    c.cuda_graph = j.value("cuda_graph", c.cuda_graph);
    c.init = j.value("init", c.init);
    // Absent: a run from before fill-in-the-middle, which trained without it (an exact resume keeps it so).
    c.fim_rate = j.value("fim_rate", 0.0);
    c.fim_spm_rate = j.value("fim_spm_rate", c.fim_spm_rate);
    c.fim_domains = j.value("fim_domains", c.fim_domains);
    c.optim = OptimizerConfig::from_json(j.at("optim"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("training configuration: ") + e.what());
  }
  return c;
}

std::vector<std::string> default_fim_domains() { return data::fim_default_domains(); }

std::string default_run_dir(const std::string& recipe_file, const std::string& root) {
  std::string name = recipe_file.substr(recipe_file.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) name.resize(name.size() - 5);
  const std::string base = root + "/" + name;
  std::string dir = base;
  for (int n = 2; ::access(dir.c_str(), F_OK) == 0; ++n) dir = base + "-" + std::to_string(n);
  return dir;
}

// ---------------------------------------------------------------------------------------------------------------
// State

struct Trainer::State {
  Recipe recipe;
  std::string recipe_text;
  torch::Device device{torch::kCPU};
  std::unique_ptr<model::HybridLM> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<data::TokenLoader> loader;
  std::vector<data::ShardSource> validation;
  torch::Tensor token_bytes;  // [V] float64: bytes each id decodes to (bits per byte); undefined without tokenizer
  std::unique_ptr<data::Tokenizer> tokenizer;  // the shards' tokenizer; null with --tokenizer none or none found
  std::unique_ptr<data::FimTransform> fim;     // null when no training source has a FIM rate
  int64_t seq_len = 0;
  int64_t tokens_seen = 0;
  double flops_per_token = 0, peak_flops = 0;
  std::ofstream metrics;
  std::string last_checkpoint;
  std::vector<std::string> notes;  // what the run should know about its data, logged at the start
  std::string init_from;           // the checkpoint the weights came from (--init), logged at the start
  DistEnv dist_env;
  std::unique_ptr<DataParallel> dist;  // world size > 1 only; declared last so its hooks go before the model
};

namespace {

void validate(const TrainConfig& c) {
  auto positive = [](int64_t v, const char* what) {
    if (v < 1) throw Error(std::string(what) + " must be >= 1 (got " + std::to_string(v) + ")");
  };
  positive(c.batch, "--batch");
  positive(c.accum, "--accum");
  if (c.steps < 0 || c.token_budget < 0) throw Error("--steps and --tokens must not be negative");
  if (c.steps == 0 && c.token_budget == 0) throw Error("give --steps or --tokens (a token budget)");
  if (c.grad_clip < 0) throw Error("--grad-clip must be >= 0");
  if (c.max_bad_steps < 1) throw Error("--max-bad-steps must be >= 1");
  if (c.out.empty()) throw Error("--out (the run directory) is required");
  parse_device(c.device);  // throws for a name other than cpu and cuda, or cuda without a GPU
  if (c.bucket_elements < 1) throw Error("--bucket-elements must be >= 1");
  if (c.expert_parallel < 1) throw Error("--expert-parallel must be >= 1");
  for (const auto& [d, w] : c.mix)
    if (!(w > 0)) throw Error("--mix " + d + "=" + std::to_string(w) + ": weights must be > 0");
  if (!(c.fim_rate >= 0 && c.fim_rate <= 1))
    throw Error("--fim-rate " + std::to_string(c.fim_rate) + " must lie in [0, 1] (0: no fill-in-the-middle)");
  if (!(c.fim_spm_rate >= 0 && c.fim_spm_rate <= 1))
    throw Error("--fim-spm-rate " + std::to_string(c.fim_spm_rate) + " must lie in [0, 1]");
  c.lr.validate("--lr-schedule");
}

// A checkpoint's model tensors against the model's own: the same names and shapes, else slm::Error naming `where`.
void check_model_tensors(const TensorMap& ck, const TensorMap& mine, const std::string& where,
                         const std::string& recipe) {
  for (const auto& [name, t] : mine) {
    auto it = ck.find(name);
    if (it == ck.end()) throw Error(where + ": tensor " + name + " is missing");
    if (it->second.sizes() != t.sizes())
      throw Error(where + ": tensor " + name + " has the wrong shape for recipe " + recipe);
  }
  for (const auto& [name, _] : ck)
    if (!mine.count(name)) throw Error(where + ": tensor " + name + " is not part of the model of recipe " + recipe);
}

void copy_model_tensors(const TensorMap& ck, TensorMap& mine) {
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : mine) t.copy_(ck.at(name));
}

// resuming: the checkpoint's weights replace the initial ones, so --init's are not read.
std::unique_ptr<Trainer::State> build_state(const TrainConfig& cfg, const std::string& recipe_text,
                                            bool resuming = false) {
  validate(cfg);
  auto s = std::make_unique<Trainer::State>();
  s->recipe_text = recipe_text;
  s->recipe = parse_recipe_text(recipe_text, cfg.recipe);
  s->dist_env = DistEnv::from_environment();
  const int world = s->dist_env.world_size;
  if (cfg.batch % world != 0)
    throw Error("--batch " + std::to_string(cfg.batch) + " is the global batch: it must divide by the " +
                std::to_string(world) + " workers");
  if (cfg.expert_parallel > 1) {
    const int ep = cfg.expert_parallel;
    if (world % ep != 0)
      throw Error("--expert-parallel " + std::to_string(ep) + " spreads the experts over " + std::to_string(ep) +
                  " workers: it must divide the " + std::to_string(world) +
                  " worker(s) (start them with --nproc N, or give --expert-parallel 1)");
    if (!s->recipe.moe)
      throw Error("--expert-parallel: recipe " + cfg.recipe + " has no MoE layers (no routed experts to spread)");
    if (s->recipe.moe->routed_experts % ep != 0)
      throw Error("--expert-parallel " + std::to_string(ep) + " must divide the recipe's " +
                  std::to_string(s->recipe.moe->routed_experts) + " routed experts");
  }
  s->device = torch::Device(torch::kCPU);
  if (cfg.device == "cuda") {
    const int gpu = s->dist_env.local_rank;
    if (gpu >= static_cast<int>(torch::cuda::device_count()))
      throw Error("worker " + std::to_string(s->dist_env.rank) + " wants GPU " + std::to_string(gpu) + ", but " +
                  std::to_string(torch::cuda::device_count()) + " are visible");
    s->device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpu));
#ifdef SLM_WITH_CUDA
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(gpu));  // kernels and allocations without an index go there
#endif
  }
  s->seq_len = cfg.seq_len > 0 ? cfg.seq_len : s->recipe.seq_len;
  if (s->seq_len < 2) throw Error("sequence length must be >= 2 (recipe seq_len or --seq-len)");

  auto train = find_sources(cfg, "train", s->seq_len);
  s->validation = find_sources(cfg, "validation", s->seq_len);
  for (const auto* sources : {&train, &s->validation})
    for (const auto& src : *sources)
      for (const auto& path : src.shards) {
        auto shard = data::Shard::open(path, /*verify=*/false);
        if (shard->vocab_size() <= static_cast<uint32_t>(s->recipe.vocab_size)) continue;
        const auto extra = shard->sidecar().value("extra", nlohmann::json());
        const std::string tok = extra.is_object() ? extra.value("tokenizer", "") : "";
        const std::string v = std::to_string(shard->vocab_size()), rv = std::to_string(s->recipe.vocab_size);
        throw Error(path + ": tokenized with " + (tok.empty() ? std::string("a tokenizer") : tok) + " (vocabulary " +
                    v + "), which does not fit recipe " + cfg.recipe + " (vocab_size " + rv +
                    "); shard the data with a tokenizer of at most " + rv +
                    " ids, or train a recipe with vocab_size >= " + v);
      }
  // A held-out tail (split_sources) is announced: the training data is smaller than the shards by it.
  for (const auto& v : s->validation)
    if (v.begin > 0) {
      uint64_t total = 0;
      for (const auto& path : v.shards) total += data::Shard::open(path, /*verify=*/false)->token_count();
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.1f%%",
                    100.0 * static_cast<double>(total - v.begin) / static_cast<double>(total));
      s->notes.push_back("domain '" + v.name + "' has no validation split: its last " +
                         std::to_string(total - v.begin) + " of " + std::to_string(total) + " tokens (" + pct +
                         ") are held out for validation");
    }
  for (const auto& t : train)
    if (std::none_of(s->validation.begin(), s->validation.end(), [&](const auto& v) { return v.name == t.name; }))
      s->notes.push_back("domain '" + t.name +
                         "' has no validation split and too few tokens to hold one out: no "
                         "validation loss for it");
  data::LoaderOptions lo;
  lo.batch_size = cfg.batch;
  lo.seq_len = s->seq_len;
  lo.seed = cfg.seed;
  s->loader = std::make_unique<data::TokenLoader>(train, lo);

  // Bits per byte needs the bytes each id stands for: the tokenizer the shards record, looked up in tokenizer/.
  std::string tokenizer = cfg.tokenizer;
  if (tokenizer.empty()) tokenizer = shard_tokenizer(train.front().shards.front());
  std::vector<int64_t> canonical;  // Engram's compression map of the tokenizer's vocabulary
  if (!tokenizer.empty() && tokenizer != "none") {
    s->tokenizer = std::make_unique<data::Tokenizer>(data::Tokenizer::load(tokenizer));
    const data::Tokenizer& tok = *s->tokenizer;
    if (s->recipe.engram.enabled) {
      canonical = data::engram_canonical_map(tok);
      canonical.resize(s->recipe.vocab_size);
      for (size_t id = tok.vocab_size(); id < canonical.size(); ++id) canonical[id] = static_cast<int64_t>(id);
    }
    if (tok.vocab_size() > static_cast<uint32_t>(s->recipe.vocab_size))
      throw Error(tokenizer + ": vocabulary " + std::to_string(tok.vocab_size()) + " exceeds the recipe's " +
                  std::to_string(s->recipe.vocab_size));
    s->token_bytes = token_byte_counts(tok, s->recipe.vocab_size);
  }
  // Fill-in-the-middle on the training windows of the FIM domains (after the loader cut them: data/fim.h).
  std::vector<double> fim_rates;
  std::string fim_on;
  for (const auto& src : train) {
    const bool on = cfg.fim_rate > 0 && std::count(cfg.fim_domains.begin(), cfg.fim_domains.end(), src.name) > 0;
    fim_rates.push_back(on ? cfg.fim_rate : 0.0);
    if (on) fim_on += (fim_on.empty() ? "" : ", ") + src.name;
  }
  if (!fim_on.empty()) {
    if (!s->tokenizer)
      throw Error("fill-in-the-middle (--fim-rate " + std::to_string(cfg.fim_rate) + " on domain(s) " + fim_on +
                  ") re-encodes the split documents and needs the tokenizer the shards were made with: name it with "
                  "--tokenizer MODEL, or train without FIM (--fim-rate 0)");
    s->fim = std::make_unique<data::FimTransform>(*s->tokenizer, fim_rates, cfg.fim_spm_rate, cfg.seed);
    auto pct = [](double r) {
      char b[32];
      std::snprintf(b, sizeof b, "%.4g%%", 100 * r);
      return std::string(b);
    };
    s->notes.push_back("fill-in-the-middle on " + pct(cfg.fim_rate) + " of the documents of " + fim_on + " (" +
                       pct(cfg.fim_spm_rate) + " of them in SPM order)");
  }

  torch::manual_seed(cfg.seed);
  try {
    s->model =
        std::make_unique<model::HybridLM>(s->recipe, torch::TensorOptions().dtype(torch::kFloat).device(s->device));
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    throw Error(out_of_memory_text(e, cfg, s->recipe, s->seq_len, s->device, world, "building the model"));
  }
  s->model->train();
  s->model->set_recompute(cfg.recompute);
  if (!canonical.empty()) s->model->set_engram_canonical_ids(canonical);
  if (!cfg.init.empty() && !resuming) {
    // Weights only (branching a specialist from a shared base, fine-tuning): the optimizer, the schedule and the
    // data order start fresh. Whole expert tensors are loaded before spread_experts narrows them.
    TensorMap weights;
    std::string where;
    if (cfg.init.ends_with(".safetensors")) {
      // A weights file (slm quantize's output among them): NVFP4 tensors are dequantized, so a shipped model can be
      // trained further from what it ships.
      nvfp4::Checkpoint file = nvfp4::load_checkpoint(cfg.init);
      for (auto& [name, t] : file.dense) weights.emplace(name, t);
      for (auto& [name, q] : file.quantized) weights.emplace(name, nvfp4::dequantize(q, torch::kFloat));
      where = cfg.init;
      s->init_from = cfg.init + (file.quantized.empty() ? "" : " (NVFP4 tensors dequantized)");
    } else {
      CheckpointData ck = load_checkpoint(cfg.init);
      weights = std::move(ck.model);
      const std::string dir = ck.meta.value("checkpoint_dir", cfg.init);
      where = dir + "/model.safetensors";
      s->init_from = dir + " (step " + std::to_string(ck.meta.at("step").get<int64_t>()) + ")";
    }
    auto mine = model::named_state(*s->model);
    check_model_tensors(weights, mine, where, cfg.recipe);
    copy_model_tensors(weights, mine);
  }
  const auto& layers = s->model->plan().layers;
  if (cfg.dsa_warmup_steps > 0 && std::none_of(layers.begin(), layers.end(), [](const LayerPlan& l) { return l.dsa; }))
    throw Error("--dsa-warmup-steps: recipe " + cfg.recipe + " has no DSA layers");
  if (world > 1) {
    s->dist = std::make_unique<DataParallel>(s->dist_env, s->device, cfg.expert_parallel);
    if (auto group = s->dist->expert_group()) s->model->spread_experts(group);  // before the optimizer takes them
  }
  s->optimizer = std::make_unique<Optimizer>(*s->model, cfg.optim);
  if (s->dist) {
    s->dist->attach(*s->optimizer, cfg.bucket_elements);
    // One starting point, whatever each device's initialisation did; an expert share from its replica group's first.
    std::vector<torch::Tensor> all, experts;
    for (const auto& [name, t] : model::named_state(*s->model))
      (cfg.expert_parallel > 1 && model::is_routed_expert(name) ? experts : all).push_back(t);
    s->dist->broadcast(all);
    s->dist->broadcast_replicas(experts);
  }

  auto plan = make_plan(s->recipe);
  s->flops_per_token = flops_per_token(s->recipe, plan, s->seq_len).total();
  if (s->device.is_cuda()) {
    s->peak_flops = cfg.peak_tflops > 0 ? cfg.peak_tflops * 1e12 : 0;
    if (s->peak_flops == 0) s->peak_flops = peak_flops_for(cuda_device_name(s->device.index()));
    s->peak_flops *= world;  // tokens/s counts every worker
  }
  return s;
}

}  // namespace

Trainer::Trainer(std::unique_ptr<State> s, TrainConfig cfg, std::ostream& log)
    : s_(std::move(s)), cfg_(std::move(cfg)), log_(s_->dist_env.rank == 0 ? &log : &null_stream()) {
  const int64_t tokens_per_step = cfg_.batch * cfg_.accum * s_->seq_len;
  total_steps_ = cfg_.steps > 0 ? cfg_.steps : (cfg_.token_budget + tokens_per_step - 1) / tokens_per_step;
  for (const auto& n : s_->notes) *log_ << "data: " << n << "\n";
  if (!s_->init_from.empty()) *log_ << "weights: initialised from " << s_->init_from << "\n";
}

Trainer::Trainer(TrainConfig config, std::ostream& log)
    : Trainer(build_state(config, read_file(config.recipe)), config, log) {
  if (!io::latest_checkpoint(cfg_.out).empty())
    throw Error(cfg_.out + " already holds a checkpoint: continue it with --resume " + cfg_.out +
                " or choose another --out");
  if (s_->dist_env.rank != 0) return;  // rank 0 owns the run directory
  make_dirs(cfg_.out);
  s_->metrics.open(cfg_.out + "/metrics.jsonl", std::ios::trunc);
  if (!s_->metrics) throw Error(cfg_.out + "/metrics.jsonl: cannot write");
  write_file_atomic(cfg_.out + "/config.json", cfg_.to_json().dump(2) + "\n");
}

Trainer Trainer::resume(const std::string& dir, const nlohmann::json& overrides, std::ostream& log) {
  CheckpointData ck = load_checkpoint(dir);
  const std::string where = ck.meta.value("checkpoint_dir", dir);
  nlohmann::json cj;
  try {
    // Through TrainConfig once, so that a run saved before a setting existed takes its default (and its override).
    cj = TrainConfig::from_json(ck.meta.at("config")).to_json();
    for (const auto& [k, v] : overrides.items()) {
      if (!cj.contains(k)) throw Error("resume: unknown override '" + k + "'");
      cj[k] = v;
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + "/meta.json: " + e.what());
  }
  TrainConfig cfg = TrainConfig::from_json(cj);
  const bool same_data = cfg.data == TrainConfig::from_json(ck.meta.at("config")).data;
  cfg.out = dir;
  const std::string recipe_text = ck.meta.at("recipe_text").get<std::string>();
  auto s = build_state(cfg, recipe_text, /*resuming=*/true);

  // Spread experts take their share of the whole stacked tensors the checkpoint holds (saved under any layout).
  if (const int ep = s->model->expert_parallel(); ep > 1) {
    const int q = s->dist->expert_group()->rank();
    for (auto* tensors : {&ck.model, &ck.optimizer})
      for (auto& [name, t] : *tensors) {
        const std::string param = name.rfind("muon.momentum/", 0) == 0 ? name.substr(14) : name;
        if (!model::is_routed_expert(param) || t.dim() < 1 || t.size(0) % ep != 0) continue;  // checked below
        const int64_t share = t.size(0) / ep;
        t = t.narrow(0, q * share, share);
      }
  }
  // Everything is checked before the model and the optimizer change: names, shapes, dtypes.
  auto mine = model::named_state(*s->model);
  check_model_tensors(ck.model, mine, where + "/model.safetensors", cfg.recipe);
  TensorMap opt_state;
  for (const auto& [name, t] : ck.optimizer)
    if (name.rfind("rng/", 0) != 0) opt_state.emplace(name, t);
  s->optimizer->load_state(opt_state, ck.meta.at("optimizer"));
  copy_model_tensors(ck.model, mine);
  // The same data continues exactly where it stopped; new data (the next pack) is read from its beginning.
  if (same_data)
    s->loader->restore(data::LoaderCursor::from_json(ck.meta.at("data_cursor")));
  else
    log << "slm: resuming on new data " << cfg.data << ": its loader starts at the beginning\n";
  if (auto it = ck.optimizer.find("rng/cpu"); it != ck.optimizer.end()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the default generator's state
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second);
  }
  s->tokens_seen = ck.meta.at("tokens_seen").get<int64_t>();
  s->last_checkpoint = where;

  Trainer t(std::move(s), cfg, log);
  t.step_ = ck.meta.at("step").get<int64_t>();
  if (t.s_->dist_env.rank != 0) return t;
  // Lines logged after the checkpoint (a run killed between checkpoints) are replaced by the resumed run's.
  const std::string metrics_path = dir + "/metrics.jsonl";
  std::string kept;
  {
    std::ifstream in(metrics_path);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.value("step", int64_t{0}) <= t.step_) kept += line + "\n";
    }
  }
  write_file_atomic(metrics_path, kept);
  t.s_->metrics.open(metrics_path, std::ios::app);
  log << "resumed " << where << " at step " << t.step_ << " of " << t.total_steps_ << "\n";
  return t;
}

Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;

std::string Trainer::save() {
  CheckpointData ck;
  if (s_->dist) s_->dist->gather_muon_momentum();  // each rank holds the momentum of its own matrices only
  ck.model = model::named_state(*s_->model);
  for (auto& [name, t] : s_->optimizer->state_tensors()) ck.optimizer.emplace(name, t);
  if (s_->model->expert_parallel() > 1)  // whole expert tensors, so that any layout resumes (every rank gathers)
    for (auto* tensors : {&ck.model, &ck.optimizer})
      for (auto& [name, t] : *tensors) {
        const std::string param = name.rfind("muon.momentum/", 0) == 0 ? name.substr(14) : name;
        if (model::is_routed_expert(param)) t = s_->dist->gather_experts(t);
      }
  if (s_->dist && s_->dist->rank() != 0) return "";
  ck.optimizer.emplace("rng/cpu", at::detail::getDefaultCPUGenerator().get_state());
  ck.meta = {{"format", "slm-checkpoint"},
             {"version", 1},
             {"step", step_},
             {"total_steps", total_steps_},
             {"tokens_seen", s_->tokens_seen},
             {"recipe_name", s_->recipe.name},
             {"recipe_text", s_->recipe_text},
             {"config", cfg_.to_json()},
             {"data_cursor", s_->loader->cursor().to_json()},
             {"optimizer", s_->optimizer->state_json()}};
  s_->last_checkpoint = save_checkpoint(cfg_.out, ck, cfg_.keep_last);
  return s_->last_checkpoint;
}

std::map<std::string, std::pair<double, double>> Trainer::evaluate() {
  std::map<std::string, std::pair<double, double>> out;
  for (const auto& [d, r] : evaluate_model(*s_->model, s_->validation, {cfg_.batch, s_->seq_len, cfg_.eval_batches},
                                           s_->token_bytes, s_->device))
    out[d] = {r.loss, r.bpb};
  return out;
}

ClipGroups clip_groups(const model::HybridLM& model) {
  ClipGroups g;
  g.indexer = model.indexer_parameters();
  std::set<const void*> indexer;
  for (const auto& p : g.indexer) indexer.insert(p.unsafeGetTensorImpl());
  for (const auto& p : model.parameters())
    if (!indexer.count(p.unsafeGetTensorImpl())) g.lm.push_back(p);
  return g;
}

namespace {

std::vector<torch::Tensor> defined_grads(const std::vector<torch::Tensor>& ps) {
  std::vector<torch::Tensor> g;
  for (const auto& p : ps)
    if (p.grad().defined()) g.push_back(p.grad());
  return g;
}

}  // namespace

torch::Tensor grad_square_sums(const ClipGroups& groups, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  auto sum_sq = [&](const std::vector<torch::Tensor>& ps) {
    const auto grads = defined_grads(ps);
    if (grads.empty()) return torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    if (grads.front().is_cuda()) {
      // One multi-tensor launch for the per-tensor norms (in the gradients' FP32), squared and summed in float64:
      // a chain of per-tensor kernels here cost hundreds of launches per step.
      auto norms = at::stack(at::_foreach_norm(grads, 2)).to(torch::kDouble);
      return norms.pow(2).sum().to(device);
    }
    torch::Tensor sq;
    for (const auto& g : grads) {
      auto s = g.to(torch::kDouble).pow(2).sum();
      sq = sq.defined() ? sq + s : s;
    }
    return sq.to(device);
  };
  return torch::stack({sum_sq(groups.lm), sum_sq(groups.indexer)});
}

GradNorms grad_norms(const ClipGroups& groups) {
  const auto& any = groups.lm.empty() ? groups.indexer : groups.lm;
  const auto sums = grad_square_sums(groups, any.empty() ? torch::Device(torch::kCPU) : any.front().device()).cpu();
  return {std::sqrt(sums[0].item<double>()), std::sqrt(sums[1].item<double>())};
}

void clip_gradients(const ClipGroups& groups, const GradNorms& norms, double max_norm) {
  torch::NoGradGuard no_grad;
  auto clip = [max_norm](const std::vector<torch::Tensor>& ps, double norm) {
    if (max_norm <= 0 || !std::isfinite(norm) || norm <= max_norm) return;
    auto grads = defined_grads(ps);
    if (!grads.empty()) at::_foreach_mul_(grads, max_norm / (norm + 1e-6));
  };
  clip(groups.lm, norms.lm);
  clip(groups.indexer, norms.indexer);
}

// DeepSeek's indexer warm-up: the main attention stays dense and only the indexers train (their KL to the
// attention distribution); afterwards everything trains and attention reads the selected keys.
void Trainer::set_dsa_warmup(bool on) {
  auto& m = *s_->model;
  m.set_dsa_stage(on ? model::DsaStage::Warmup : model::DsaStage::Sparse);
  std::set<const void*> indexer;
  for (const auto& p : m.indexer_parameters()) indexer.insert(p.unsafeGetTensorImpl());
  for (auto& p : m.parameters())
    if (!indexer.count(p.unsafeGetTensorImpl())) p.set_requires_grad(!on);
}

int64_t Trainer::run(const std::atomic<bool>* stop, int64_t until) {
  try {
    return run_steps(stop, until);
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    if (::isatty(STDERR_FILENO) && log_ == &std::cerr) *log_ << "\n";  // end the progress line
    throw Error(out_of_memory_text(e, cfg_, s_->recipe, s_->seq_len, s_->device, s_->dist_env.world_size,
                                   "at step " + std::to_string(step_ + 1)) +
                (s_->last_checkpoint.empty() ? "" : "\nThe last checkpoint is " + s_->last_checkpoint + "."));
  }
}

int64_t Trainer::run_steps(const std::atomic<bool>* stop, int64_t until) {
  auto& m = *s_->model;
  auto& opt = *s_->optimizer;
  const ClipGroups clip = clip_groups(m);
  const bool tty = ::isatty(STDERR_FILENO) && log_ == &std::cerr;
  const int64_t start_step = step_;
  const int64_t print_every = std::max<int64_t>(1, total_steps_ / 50);
  const int64_t tokens_per_step = cfg_.batch * cfg_.accum * s_->seq_len;
  if (step_ == 0) *log_ << opt.describe();
  *log_ << "training " << s_->recipe.name << " for " << total_steps_ << " steps of " << tokens_per_step << " tokens on "
        << cfg_.device << " (" << s_->loader->num_sources() << " domains), run directory " << cfg_.out << "\n";
  int bad = 0;
  double ema_step_s = 0;
  auto t_run = Clock::now();
  auto log_eval = [&] {
    auto res = evaluate();
    nlohmann::json e = nlohmann::json::object();
    std::ostringstream line;
    line << "eval step " << step_ << ":";
    for (const auto& [d, lb] : res) {
      e[d] = {{"loss", lb.first}, {"bpb", std::isnan(lb.second) ? nlohmann::json() : nlohmann::json(lb.second)}};
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s loss %.4f bpb %.4f", d.c_str(), lb.first, lb.second);
      line << buf;
    }
    s_->metrics << nlohmann::json{{"step", step_}, {"eval", e}}.dump() << "\n" << std::flush;
    if (tty) *log_ << "\r\033[K";
    *log_ << line.str() << "\n";
  };

  DataParallel* dist = s_->dist.get();
  const int64_t rows = cfg_.batch / (dist ? dist->world_size() : 1);  // this rank's slice of the global batch
  const int64_t row0 = dist ? dist->rank() * rows : 0;
  // The profiled stretch starts after two steps (allocator, kernel and autotuning caches warm) and ends with the
  // step's metrics; rank 0 writes it.
  const int64_t profile_from = start_step + 2, profile_to = profile_from + cfg_.profile_steps;
  Profiler profiler;
  std::unique_ptr<GraphStep> graph;
  if (cfg_.cuda_graph) {
    if (const std::string why = graph_step_blocker(m, dist != nullptr, cfg_.recompute); !why.empty())
      throw Error("--cuda-graph: " + why);
    graph = std::make_unique<GraphStep>(m, rows, s_->seq_len, cfg_.accum);
    *log_ << "CUDA graphs: every micro-batch's forward and backward replays one graph (captured at the first)\n";
  }
  // A graph accumulates into gradient buffers that exist before its capture: they are zeroed, not dropped.
  auto zero_grad = [&] { graph ? graph->zero_grad() : opt.zero_grad(); };
  // One micro-batch's forward and backward, launched op by op; arm: the backward also launches the data-parallel
  // gradient reductions (the step's last micro-batch).
  auto eager_micro_batch = [&](const torch::Tensor& tokens, const torch::Tensor& docs, bool arm) {
    const DeviceBatch b = *stage_batch(tokens, docs, s_->device);
    const model::Documents* d = b.docs ? &*b.docs : nullptr;
    model::LossOutput out;
    {
      // BF16 compute on a GPU, FP32 master weights and optimizer state.
      const AutocastScope bf16(at::kCUDA, s_->device.is_cuda());
      out = m.loss(b.x, b.y, d, b.window);
    }
    if (arm) dist->arm();
    (out.total / static_cast<double>(cfg_.accum)).backward();
    return out.main;
  };
  while (step_ < total_steps_) {
    if (cfg_.profile_steps > 0 && step_ == profile_from) profiler.start(s_->device.is_cuda());
    const bool out_of_time = cfg_.max_minutes > 0 && now_s(t_run) > 60 * cfg_.max_minutes;
    bool halt = (stop && stop->load()) || step_ == until || out_of_time;
    if (dist) halt = dist->any(halt);  // every rank stops at the same step
    if (halt) {
      if (tty) *log_ << "\n";
      *log_ << "stopping at step " << step_ << ": saved " << save() << "\n";
      return step_ - start_step;
    }
    auto t0 = Clock::now();
    const bool warmup = step_ < cfg_.dsa_warmup_steps;
    if (cfg_.dsa_warmup_steps > 0) set_dsa_warmup(warmup);
    const double mult = cfg_.lr.multiplier(step_, total_steps_);
    zero_grad();
    torch::Tensor loss_sum;  // float64 on the device: the main loss averaged over the micro-batches
    for (int64_t a = 0; a < cfg_.accum; ++a) {
      // Every rank reads the whole global batch (the same loader state everywhere) and trains on its rows.
      auto batch = s_->loader->next();
      if (s_->fim) s_->fim->apply(batch, row0, rows);  // this rank's rows, rewritten in place
      auto tokens = batch.tokens.narrow(0, row0, rows);
      auto docs = batch.doc_ids.narrow(0, row0, rows);  // packed documents are trained each alone
      torch::Tensor main;
      if (graph) {
        main = graph->run(tokens, docs);
      } else {
        main = eager_micro_batch(tokens, docs, dist && a == cfg_.accum - 1);
      }
      const auto part = main.detach().to(torch::kDouble) / static_cast<double>(cfg_.accum);
      loss_sum = loss_sum.defined() ? loss_sum + part : part;
    }
    double loss = 0;
    GradNorms norms;
    if (dist) {
      const auto r = dist->finish(loss_sum.item<double>(), clip.indexer);
      loss = r.loss;
      norms = {std::sqrt(r.grad_sq), std::sqrt(r.indexer_grad_sq)};
    } else {
      // The loss and both gradient norms in one read, the step's one wait for the device.
      const auto host = torch::cat({loss_sum.view({1}), grad_square_sums(clip, s_->device)}).cpu();
      loss = host[0].item<double>();
      norms = {std::sqrt(host[1].item<double>()), std::sqrt(host[2].item<double>())};
    }
    clip_gradients(clip, norms, cfg_.grad_clip);

    const bool finite = std::isfinite(loss) && std::isfinite(norms.lm) && std::isfinite(norms.indexer);
    if (finite) {
      if (dist) {
        opt.step(mult, dist->shard());
        dist->gather_muon_weights();
      } else {
        opt.step(mult);
      }
      if (warmup) {  // only the indexers learn in the DSA warm-up, the balance included
        for (auto* moe : m.moe_modules()) moe->pending_load().zero_();
      } else {
        if (dist)  // the bias moves by the expert loads of the whole global batch
          for (auto* moe : m.moe_modules()) dist->all_reduce_sum(moe->pending_load());
        m.update_balancing_biases();
      }
      bad = 0;
    } else {
      zero_grad();
      for (auto* moe : m.moe_modules()) moe->pending_load().zero_();  // a skipped step must not steer the balance
      ++bad;
    }
    ++step_;
    s_->tokens_seen += tokens_per_step;
    const double dt = now_s(t0);
    ema_step_s = step_ - start_step == 1 ? dt : 0.9 * ema_step_s + 0.1 * dt;
    const double tps = static_cast<double>(tokens_per_step) / dt;
    const double mfu = s_->peak_flops > 0 ? tps * s_->flops_per_token / s_->peak_flops : 0;
    if (!finite || step_ % cfg_.log_every == 0 || step_ == total_steps_) {
      nlohmann::json j = {{"step", step_},         {"loss", loss},          {"lr", mult * cfg_.optim.matrix_lr},
                          {"lr_multiplier", mult}, {"grad_norm", norms.lm}, {"tokens", s_->tokens_seen},
                          {"tokens_per_s", tps}};
      if (!clip.indexer.empty()) j["indexer_grad_norm"] = norms.indexer;
      if (mfu > 0) j["mfu"] = mfu;
#ifdef SLM_WITH_CUDA
      if (s_->device.is_cuda()) {  // what the step needed at most, for the memory budget of larger runs
        const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(s_->device.index());
        j["gpu_peak_gib"] = static_cast<double>(stats.allocated_bytes[0].peak) / (1ull << 30);
      }
#endif
      if (!finite) j["skipped"] = true;
      s_->metrics << j.dump() << "\n" << std::flush;
    }
    if (!finite) {
      if (tty) *log_ << "\n";
      *log_ << "step " << step_ << ": non-finite " << (std::isfinite(loss) ? "gradient norm" : "loss") << " (loss "
            << loss << ", grad norm " << norms.lm << ", indexer grad norm " << norms.indexer << "); step skipped ("
            << bad << " in a row)\n";
      if (bad >= cfg_.max_bad_steps)
        throw Error("stopping: " + std::to_string(bad) +
                    " consecutive steps with a non-finite loss or gradient (last at step " + std::to_string(step_) +
                    "); the last good checkpoint is " +
                    (s_->last_checkpoint.empty() ? std::string("(none)") : s_->last_checkpoint) +
                    ". Lower the learning rate or check the data.");
    }
    if (profiler.running() && (step_ == profile_to || step_ == total_steps_)) {
      const std::string dir = cfg_.out + "/profile";
      make_dirs(dir);
      const bool writer = !dist || dist->rank() == 0;
      auto summary = profiler.stop(step_ - profile_from, writer ? dir + "/trace.json" : "");
      if (writer) {
        write_file_atomic(dir + "/summary.txt", summary.text(25));
        if (tty) *log_ << "\r\033[K";
        *log_ << summary.text() << "(Chrome trace and the full table in " << dir << ")\n";
      }
    }
    char line[256], mfu_text[32] = "";
    if (mfu > 0) std::snprintf(mfu_text, sizeof mfu_text, " | MFU %.1f%%", 100 * mfu);
    const double eta = ema_step_s * static_cast<double>(total_steps_ - step_);
    std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | lr %.3g | %.0f tok/s%s | ETA %s",
                  static_cast<long long>(step_), static_cast<long long>(total_steps_), loss,
                  mult * cfg_.optim.matrix_lr, tps, mfu_text, fmt_duration(eta).c_str());
    if (tty)
      *log_ << "\r\033[K" << line << std::flush;
    else if (step_ % print_every == 0 || step_ == total_steps_)
      *log_ << line << "\n";
    const bool last = step_ == total_steps_;
    // Rank 0 evaluates alone, unless the experts are spread: then every rank runs the same batches with it.
    if (((cfg_.eval_every > 0 && step_ % cfg_.eval_every == 0) || last) &&
        (!dist || dist->rank() == 0 || dist->expert_parallel() > 1))
      log_eval();
    if ((cfg_.checkpoint_every > 0 && step_ % cfg_.checkpoint_every == 0) || last) {
      auto dir = save();
      if (tty) *log_ << "\r\033[K";
      *log_ << "checkpoint " << dir << "\n";
    }
  }
  if (tty) *log_ << "\n";
  *log_ << "trained " << step_ - start_step << " steps in " << fmt_duration(now_s(t_run));
  if (graph)
    *log_ << " (" << graph->captures() << " CUDA graph capture(s), up to " << graph->document_capacity()
          << " documents per micro-batch)";
  *log_ << "\n";
  return step_ - start_step;
}

}  // namespace slm::train
