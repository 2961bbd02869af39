#pragma once
// Parameter accounting computed analytically from the recipe: every named tensor the model holds, with its
// shape, so counts are exact and the built model can be checked against this list name by name.
//
// Conventions (docs/recipes.md explains them):
//   total   stored parameters of the main model (embedding, layers, final norm, LM head, mHC, Engram
//           projections); MTP modules and Engram tables are reported separately.
//   active  parameters touched per token: everything in total, except that routed experts count k of N.
//           The input embedding is counted (one row is read per token; DeepSeek counts it the same way);
//           active_excl_embedding drops it.
//   stored  total + MTP + Engram tables: what a checkpoint holds.
#include <map>
#include <string>
#include <vector>

#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm {

enum class ParamKind {
  Embedding,  // token embedding table
  Head,       // LM head
  Linear,     // dense projection (attention, MLA, Mamba/M2RNN in/out, MLP, shared expert, MTP proj, Engram)
  Expert,     // routed expert weights, stacked [experts, out, in]
  Router,     // MoE gate
  Indexer,    // DSA lightning-indexer projections (kept in BF16, as the product does)
  Mixing,     // mHC mixing projections
  Norm,       // RMSNorm / LayerNorm gains and biases
  Vector,     // small per-head/per-channel vectors and matrices (biases, D, dt_bias, ...)
  Scalar,     // learned scalars (resid/x0 lambdas, mHC alphas)
  Conv,       // depthwise short-conv weights and biases
  Table,      // Engram hashed n-gram tables
};
const char* kind_name(ParamKind k);

struct ParamSpec {
  std::string name;
  std::vector<long long> shape;
  ParamKind kind = ParamKind::Linear;
  std::string group;    // embedding, lm_head, attention, moe, mamba3, m2rnn, mlp, engram, engram_table, mhc, norm, lambda
  bool routed = false;  // routed expert weight: k of N active per token
  bool mtp = false;     // part of an MTP module
  long long numel() const;
  bool quantized() const;  // NVFP4-eligible: Linear, Expert and Table (Engram) weights
};

struct LayerCount {
  long long total = 0;
  long long active = 0;
};

struct Accounting {
  std::vector<ParamSpec> params;
  long long total = 0;
  long long active = 0;
  long long active_excl_embedding = 0;
  long long embedding = 0;
  long long mtp_total = 0;
  long long mtp_active = 0;
  long long engram_tables = 0;
  long long engram_lookups_per_token = 0;  // table elements gathered per token (all Engram layers)
  long long stored = 0;
  std::map<std::string, long long> by_family;  // main-model total by group
  std::vector<LayerCount> layers;              // main stack, per layer (Engram tables excluded)
  long long bytes_bf16 = 0;                    // every stored parameter in BF16
  long long bytes_nvfp4 = 0;                   // NVFP4-eligible weights packed (docs/formats.md), the rest BF16
};

// The tensors of one layer, named with prefix ("layers.3."). streams: mHC stream count (1 without mHC).
// engram_primes: the table sizes of this layer's Engram tables (empty when the layer has none).
std::vector<ParamSpec> layer_param_specs(const Recipe& recipe, const LayerPlan& layer, const std::string& prefix,
                                         int streams, const std::vector<long long>& engram_primes);

// Table sizes of every Engram layer: consecutive distinct primes >= table_rows, one per (layer, order, head),
// in layer, order, head order. Returns one vector per main-stack layer (empty where there is no Engram).
std::vector<std::vector<long long>> engram_table_primes(const Recipe& recipe, const ModelPlan& plan);

// Bytes one tensor takes in NVFP4: 16-element blocks along the last (reduction) dim, padded; 4-bit codes,
// one E4M3 scale per block, one FP32 scale per matrix.
long long nvfp4_bytes(const ParamSpec& p);

Accounting account(const Recipe& recipe, const ModelPlan& plan);

}  // namespace slm
