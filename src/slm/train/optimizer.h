#pragma once
// The training optimizer: Muon for the hidden matrices, AdamW for everything else, in named parameter groups
// decided from the recipe's parameter kinds (slm::account), with FP32 master weights and state.
//
// Groups (param_group() decides; every parameter lands in exactly one):
//   matrix    Muon   Linear (attention/MLA/Mamba-3/M2RNN/MLP/shared-expert/MTP/Engram projections), Expert
//                    (every routed expert matrix of a stacked [experts, rows, cols] tensor on its own), Mixing
//                    (mHC phi)
//   embedding AdamW  token embedding
//   head      AdamW  LM head (the MTP modules share it)
//   router    AdamW  MoE gate [experts, d_model]. Not Muon: its rows are per-expert directions whose gradient
//                    size reflects how often the expert is routed; orthogonalising would give rarely-used
//                    experts the same update size as busy ones and fight the aux-loss-free balancing. Small
//                    and precision-sensitive (the quantizer keeps it BF16); megacpp also keeps it on AdamW.
//   indexer   AdamW  DSA lightning-indexer projections. Not Muon: the indexer learns from its own KL objective
//                    on its own stage schedule (indexer-only warm-up at an AdamW LR of 1e-3, then detached),
//                    so it keeps a separate group whose LR the trainer can switch independently.
//   norm      AdamW  RMSNorm/LayerNorm gains and biases (wd 0)
//   vector    AdamW  per-head/per-channel vectors (Mamba dt_bias/D/B,C biases/MIMO vectors, M2RNN A_log/dt_bias/
//                    D/state_weight, mHC static biases) and depthwise conv weights/biases (wd 0)
//   scalar    AdamW  resid/x0 lambdas, mHC alphas (wd 0)
//   table     AdamW  Engram hashed n-gram tables (own LR, wd 0)
// MoE balancing biases are buffers moved by their sign rule (HybridLM::update_balancing_biases), not here.
//
// Muon (notes §6.1-6.2), per matrix W [rows, cols] with gradient G:
//   B <- mu B + (1 - mu) G;  U = (1 - mu) G + mu B        (Nesterov, EMA form; mu warms up, schedule.h)
//   O = newton_schulz(U)                                  (muon.h: bf16, wide orientation, Polar Express)
//   W <- W (1 - lr wd) - lr scale(rows, cols) O           (decoupled weight decay)
// scale "jordan" = sqrt(max(1, rows/cols)) with its own LR (~0.02; update RMS ~ lr/sqrt(cols)), or
// "moonlight" = 0.2 sqrt(max(rows, cols)) (update RMS 0.2 lr, for AdamW-like LRs).
// AdamW (torch.optim.AdamW's formulation, so tests can compare): m, v EMAs; W <- W (1 - lr wd);
//   W <- W - lr/(1 - b1^t) m / (sqrt(v)/sqrt(1 - b2^t) + eps), t counted per parameter.
// Every LR is the group's base LR times step()'s multiplier times the group's scale (set_group_scale).
#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "slm/model/hybrid_lm.h"
#include "slm/recipe/accounting.h"
#include "slm/train/muon.h"

namespace slm::train {

struct OptimizerConfig {
  // Muon (group "matrix"). LR before the shape scale: Jordan/nanochat 0.02 with the "jordan" scale.
  double matrix_lr = 0.02;
  // Decoupled decay of Muon matrices (and indexer projections), W <- W (1 - lr wd) with the scheduled LR
  // (torch/Moonlight convention; Moonlight, DeepSeek-V4 and torch.optim.Muon use 0.1).
  double weight_decay = 0.1;
  double muon_momentum = 0.95;        // mu after the warmup
  double muon_momentum_start = 0.85;  // mu at step 0, linearly up to muon_momentum (nanochat)
  int64_t momentum_warmup_steps = 300;
  int ns_steps = 5;
  std::string ns_coefficients = "polar-express";  // or "quintic" (classic, muon.h says what each gives)
  // NS compute type: "auto" is bfloat16 where the parameters' device multiplies it natively (native_bf16_matmul:
  // GPUs, AMX CPUs) and float32 elsewhere; "bfloat16", "float32" or "float64" force one (float64 for checks).
  std::string ns_dtype = "auto";
  std::string muon_shape_scale = "jordan";        // or "moonlight"
  // Most elements in one NS call: same-shape matrices are stacked up to this (saves GPU launches; bounds the
  // memory of the stacked updates, 2^26 floats = 256 MiB).
  int64_t muon_stack_elements = int64_t{1} << 26;

  // AdamW groups. embed/head/table LRs are nanochat's values at width 768 and are multiplied by
  // sqrt(adamw_width_reference / d_model) (nanochat's (d/768)^-0.5; 0 turns the width scaling off).
  double embed_lr = 0.3;
  double head_lr = 0.008;
  // Engram tables are embedding-like rows updated sparsely, so they start at the embedding LR; the Engram
  // paper's "Adam at 5x the base LR" is relative to its backbone LR [S], which this recipe does not share.
  double table_lr = 0.3;
  double router_lr = 0.005;
  double indexer_lr = 1e-3;  // DSA indexer warm-up LR (DeepSeek-V3.2 / megacpp)
  double norm_lr = 0.005;    // multiplicative gains near 1: nanochat's resid-lambda LR
  double vector_lr = 0.005;
  double scalar_lr = 0.005;
  double adamw_width_reference = 768;
  double embed_weight_decay = 0.001;  // nanochat wte
  double head_weight_decay = 0.01;    // nanochat lm_head
  double adam_beta1 = 0.8;            // nanochat, every AdamW group
  double adam_beta2 = 0.95;
  double adam_embed_beta2 = 0.995;  // embedding and tables: rows seen rarely keep a longer second moment
  double adam_eps = 1e-10;

  void validate() const;  // slm::Error naming the field
  nlohmann::json to_json() const;
  // Missing fields keep their defaults; unknown fields and bad values are errors naming source.field.
  static OptimizerConfig from_json(const nlohmann::json& j, const std::string& source = "optimizer config");
};

enum class Algorithm { Muon, AdamW };

// The group a parameter belongs to, from its accounting kind (the table above).
std::string param_group(const ParamSpec& spec);
Algorithm group_algorithm(const std::string& group);
// The group names in printing order.
const std::vector<std::string>& group_names();

struct ParamGroup {
  std::string name;
  Algorithm algorithm = Algorithm::AdamW;
  double lr = 0;                // base LR (width scaling applied)
  double weight_decay = 0;      // decoupled
  double beta1 = 0, beta2 = 0;  // AdamW only
  double scale = 1;             // runtime factor on the LR (set_group_scale), 0 freezes the group
  std::vector<size_t> params;   // indices into Optimizer's parameter list
};

// The subset of Muon matrices one rank orthogonalises (assign_muon_owners); AdamW parameters are always
// updated by every rank (they are replicated).
struct MuonShard {
  int rank = 0;
  int world_size = 1;
  // Owner rank of each of muon_matrices(); empty: assign_muon_owners(muon_matrices(), world_size). Data-parallel
  // training (distributed.h) passes its own, balanced within each communication bucket.
  std::vector<int> owners;
};

class Optimizer {
 public:
  // Builds the groups from the model's named parameters and the recipe's accounting (names and shapes must
  // agree: slm::Error otherwise). Parameters must be float32 or float64 (the master weights); state matches.
  Optimizer(slm::model::HybridLM& model, OptimizerConfig cfg);

  void zero_grad();  // drops every gradient (undefined, as torch's set_to_none)
  // One step with every group's LR multiplied by lr_multiplier (the schedule's value). Parameters whose
  // gradient is undefined are skipped (no state change), so frozen groups cost nothing.
  void step(double lr_multiplier);
  // The same, but Muon only updates the matrices `shard` owns; the others keep their weights and momentum
  // (the caller all-gathers them). step(m) equals step(m, {0, 1}).
  void step(double lr_multiplier, const MuonShard& shard);
  int64_t steps() const { return steps_; }
  double momentum() const;  // Muon's mu for the next step

  // Multiplies one group's LR from now on (e.g. 0 to freeze everything but the DSA indexer in its warm-up).
  void set_group_scale(const std::string& group, double scale);

  const OptimizerConfig& config() const { return cfg_; }
  // Newton-Schulz's compute type, ns_dtype resolved for the model's device ("auto").
  torch::ScalarType ns_compute_type() const { return ns_dtype_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  const std::string& param_name(size_t i) const { return params_[i].name; }
  size_t num_params() const { return params_.size(); }
  // The live parameter tensor, its group's algorithm and (Muon only) its momentum buffer.
  const torch::Tensor& param(size_t i) const { return params_[i].value; }
  Algorithm param_algorithm(size_t i) const { return groups_[params_[i].group].algorithm; }
  const torch::Tensor& muon_momentum_buffer(size_t i) const { return params_[i].momentum; }
  // Every Muon matrix in a fixed order (model parameter order, then expert), for assign_muon_owners.
  const std::vector<MuonMatrix>& muon_matrices() const { return matrices_; }

  // A table of the groups: name, optimizer, #tensors, #params, lr, wd. verbose adds each group's tensor names.
  std::string describe(bool verbose = false) const;

  // Checkpoint state (the live tensors, not copies): "muon.momentum/<param>", "adamw.exp_avg/<param>",
  // "adamw.exp_avg_sq/<param>", "adamw.step/<param>" (int64 scalar), plus {"step", "config", "groups"} as JSON.
  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() const;
  nlohmann::json state_json() const;
  // Strict: throws slm::Error naming the missing/extra/mis-shaped/mistyped tensor or bad field; on error
  // nothing is modified. The config in meta is not applied (the trainer decides the config); group scales are.
  void load_state(const std::map<std::string, torch::Tensor>& tensors, const nlohmann::json& meta);

 private:
  struct Param {
    std::string name;
    torch::Tensor value;
    size_t group = 0;
    torch::Tensor momentum;             // Muon
    torch::Tensor exp_avg, exp_avg_sq;  // AdamW
    torch::Tensor step;                 // AdamW: int64 scalar, per parameter
  };
  void adamw_steps(const std::vector<Param*>& ps, const ParamGroup& g, double lr);
  // Muon in two passes: momentum of every owned matrix first, then NS and the weight update on stacks of
  // same-shape matrices (keyed by [rows, cols], in that order: deterministic).
  struct MuonRun {
    Param* param;
    int64_t begin, len;  // matrices [begin, begin + len) of the parameter
    double lr, weight_decay, mu;
  };
  using MuonBatches = std::map<std::pair<int64_t, int64_t>, std::vector<MuonRun>>;
  void muon_momentum(Param& p, const ParamGroup& g, double lr, double mu, const std::vector<int64_t>& owned,
                     MuonBatches& batches);
  void muon_apply(const MuonBatches& batches);

  OptimizerConfig cfg_;
  NsCoefficients ns_coefficients_;
  torch::ScalarType ns_dtype_;
  std::vector<Param> params_;
  std::vector<ParamGroup> groups_;
  std::vector<MuonMatrix> matrices_;
  int64_t steps_ = 0;
};

}  // namespace slm::train
