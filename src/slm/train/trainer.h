#pragma once
// The training loop (docs/training.md): batches from token shards, forward/backward of the one model definition,
// Muon + AdamW, the LR schedule, validation loss and bits per byte per domain, atomic checkpoints with exact
// resume, NaN/Inf step skipping, metrics.jsonl, and a progress line.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "slm/train/optimizer.h"
#include "slm/train/schedule.h"

namespace slm::train {

// The domains fill-in-the-middle is on for unless --fim-domains says otherwise (data::fim_default_domains).
std::vector<std::string> default_fim_domains();

struct TrainConfig {
  std::string recipe;                // recipe file
  std::string data;                  // shard directory: <data>/<domain>/{train,validation}-NNNNN.slmtok
  std::string out;                   // run directory (checkpoints, metrics.jsonl)
  std::string tokenizer;             // for bits per byte; "": the one the shards name, under tokenizer/; "none": no bpb
  std::string init;                  // start from this run's (or checkpoint's) model weights; fresh optimizer and data
  std::vector<std::string> domains;  // empty: every domain directory under data
  std::map<std::string, double> mix;  // sampling weight per domain (default 1)
  int64_t steps = 0;                  // optimizer steps (0: derive from token_budget)
  int64_t token_budget = 0;           // training tokens (used when steps is 0)
  int64_t batch = 8;                  // sequences per micro-batch
  int64_t seq_len = 0;                // 0: the recipe's seq_len
  int64_t accum = 1;                  // micro-batches per optimizer step
  uint64_t seed = 1;
  LrSchedule lr;                   // multiplier of every group's base LR per step
  double grad_clip = 1.0;          // gradient-norm clip of the LM and of the DSA indexers, each (0: off)
  int max_bad_steps = 5;           // consecutive non-finite steps before giving up
  int64_t eval_every = 100;        // validation interval in steps (0: only at the end)
  int64_t eval_batches = 4;        // validation micro-batches per domain
  int64_t checkpoint_every = 200;  // checkpoint interval in steps (0: only at the end)
  int keep_last = 3;               // checkpoints kept
  int64_t log_every = 1;           // metrics.jsonl interval
  int64_t dsa_warmup_steps = 0;    // steps of the DSA indexer's dense warm-up stage
  std::string device = "cpu";      // cpu | cuda
  double peak_tflops = 0;          // device peak for MFU (0: from the device name on CUDA)
  double max_minutes = 0;          // stop (with a checkpoint) after this much wall time in one run (0: no limit)
  int64_t bucket_elements = int64_t{1} << 23;  // data-parallel gradient bucket (float32 elements; distributed.h)
  int expert_parallel = 1;                     // ranks each MoE layer's routed experts are spread over (distributed.h)
  bool recompute = false;     // activation checkpointing of the A/M/R/F blocks (HybridLM::set_recompute)
  int64_t profile_steps = 0;  // profile this many steps after two warm-up steps (profile.h; 0: off)
  bool cuda_graph = false;    // replay each micro-batch's forward and backward from a CUDA graph (graph_step.h)
  // Fill-in-the-middle (data/fim.h): the share of the document fragments of the fim_domains' training windows that
  // become FIM examples, and the share of those in SPM order. Validation stays left-to-right. A run saved before
  // these existed resumes with fim_rate 0, as it was trained.
  double fim_rate = 0.5;
  double fim_spm_rate = 0.5;
  std::vector<std::string> fim_domains = default_fim_domains();
  OptimizerConfig optim;

  nlohmann::json to_json() const;
  static TrainConfig from_json(const nlohmann::json& j);
};

// Where `slm train` without --out puts a run: <root>/<recipe file name without .json>, or the first of -2, -3, ...
// appended that does not exist yet, so a second run never lands on the first.
std::string default_run_dir(const std::string& recipe_file, const std::string& root = "out/runs");

// Gradient clipping. A DSA indexer learns from its own KL objective, whose gradient reaches the indexers alone
// (docs/architecture.md, DSA); in one global norm a large indexer gradient would shrink every LM update. The
// trainer clips the LM parameters and the indexers apart, each group to --grad-clip, and logs both norms.
struct ClipGroups {
  std::vector<torch::Tensor> lm;       // every parameter but the indexers'
  std::vector<torch::Tensor> indexer;  // model.indexer_parameters()
};
ClipGroups clip_groups(const model::HybridLM& model);

struct GradNorms {
  double lm = 0, indexer = 0;
};
// The L2 norm of each group's gradients (accumulated in float64; parameters without a gradient add nothing).
GradNorms grad_norms(const ClipGroups& groups);
// The squares of those norms as a float64 tensor [2] (LM, indexers) on device, without reading them to the host.
torch::Tensor grad_square_sums(const ClipGroups& groups, const torch::Device& device);
// Scales each group's gradients by max_norm / (norm + 1e-6) when its norm (measured by the caller: grad_norms, or
// the data-parallel reduction) is finite and above max_norm; max_norm 0 clips nothing.
void clip_gradients(const ClipGroups& groups, const GradNorms& norms, double max_norm);

// One line per logged step, also what the progress line shows.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0;
  int64_t tokens = 0;
  bool skipped = false;
};

class Trainer {
 public:
  // Fresh run: out must not hold a checkpoint already (use resume). log receives the human-readable lines.
  Trainer(TrainConfig config, std::ostream& log);
  // Continues the run in dir from its latest checkpoint; overrides (steps, intervals) are applied on top of the
  // saved configuration. Throws slm::Error, changing nothing, when the checkpoint is damaged or does not match.
  static Trainer resume(const std::string& dir, const nlohmann::json& overrides, std::ostream& log);

  // Trains until the configured number of steps, until *stop becomes true or until step `until` (when >= 0); in
  // the last two cases it saves a checkpoint first. Returns the number of steps this call ran. An allocation that
  // fails becomes an slm::Error saying what did not fit and what to change (memory.h).
  int64_t run(const std::atomic<bool>* stop = nullptr, int64_t until = -1);

  const TrainConfig& config() const { return cfg_; }
  int64_t step() const { return step_; }
  int64_t total_steps() const { return total_steps_; }
  // Saves a checkpoint of the current state now.
  std::string save();

  // Mean validation loss and bits per byte per domain (the held-out "validation" split).
  std::map<std::string, std::pair<double, double>> evaluate();

  ~Trainer();
  Trainer(Trainer&&) noexcept;

  struct State;  // model, optimizer, loaders, metrics file (trainer.cpp)

 private:
  Trainer(std::unique_ptr<State> s, TrainConfig cfg, std::ostream& log);
  int64_t run_steps(const std::atomic<bool>* stop, int64_t until);  // run() without the out-of-memory message
  void set_dsa_warmup(bool on);
  std::unique_ptr<State> s_;
  TrainConfig cfg_;
  std::ostream* log_;
  int64_t step_ = 0, total_steps_ = 0;
};

}  // namespace slm::train
