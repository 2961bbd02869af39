#pragma once
// The one model definition: embedding, the expanded layer plan (one Layer object per letter), final norm,
// untied LM head, optional MTP modules. Training, evaluation and inference all run this class.
//
//   x0 = rms_norm(Emb(tokens))                      (parameter-free, as nanochat)
//   for each layer l:  x = resid_lambdas[l]·x + x0_lambdas[l]·x0;  x = x + layer_l(x)   (pre-norm inside)
//   logits = lm_head(final_norm(x)), in fp32
// With Engram, x += engram_l(x) before the layer's block on the layers that have it (features/engram.h).
// With mHC the stream is n copies of x0, each layer reads and writes it through its mix and the lambdas are
// gone; mhc_head collapses the streams before final_norm (features/mhc.h).
#include <torch/nn/modules/container/modulelist.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slm/model/decode_state.h"
#include "slm/model/features/engram.h"
#include "slm/model/features/mhc.h"
#include "slm/model/features/mtp.h"
#include "slm/model/layer.h"
#include "slm/model/layers/dsa_indexer.h"
#include "slm/model/layers/moe.h"
#include "slm/recipe/plan.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

struct ModelOutput {
  torch::Tensor logits;  // [B, T, V] fp32 (fp64 for a float64 model)
  torch::Tensor hidden;  // [B, T, D] residual stream after the last layer (collapsed by mHC, before final_norm);
                         // MTP input h^0
};

struct LossOutput {
  torch::Tensor total;             // main + (lambda / depth) * sum(mtp) + aux + indexer
  torch::Tensor main;              // next-token cross entropy
  std::vector<torch::Tensor> mtp;  // one cross entropy per MTP module
  torch::Tensor aux;               // weighted sequence-wise MoE balance losses (0 when off)
  torch::Tensor indexer;           // DSA indexer KL, summed over the DSA layers (0 without DSA); its gradient
                                   // reaches the indexers only (DsaStage)
};

// Targets equal to this id are left out of every loss (padding).
constexpr int64_t kIgnoreIndex = -1;

// Whether a parameter name is a stacked routed-expert tensor ([experts, out, in]; spread by expert parallelism).
bool is_routed_expert(const std::string& param_name);

class HybridLM : public torch::nn::Module {
 public:
  // Throws slm::Error, before allocating anything, when the recipe uses letters or features that have no
  // implementation yet. options: dtype and device of the parameters (torch::kMeta builds without memory).
  explicit HybridLM(const Recipe& recipe, const torch::TensorOptions& options = torch::TensorOptions());

  const Recipe& recipe() const { return recipe_; }
  const ModelPlan& plan() const { return plan_; }
  const std::vector<std::shared_ptr<Layer>>& layers() const { return layers_; }
  const std::vector<MtpModule>& mtp_modules() const { return mtp_; }

  // tokens [B, T] int64; docs (optional, on the tokens' device): the documents packed into each row, each run
  // as if it were alone (documents.h).
  ModelOutput forward(const torch::Tensor& tokens, const Documents* docs = nullptr);
  // Logits [B, T-k, V] of MTP module k (1-based, index k-1) at positions 0..T-k-1, i.e. predictions of
  // tokens k+1..T; hidden is forward(tokens, docs).hidden.
  std::vector<torch::Tensor> mtp_logits(const torch::Tensor& tokens, const torch::Tensor& hidden,
                                        const Documents* docs = nullptr);
  // targets[b, t] is the token after tokens[b, t] (kIgnoreIndex to skip); MTP module k is trained on
  // targets[:, k:]. doc_ids [B, T+1] (optional; data::Batch::doc_ids, any device): the document of every token of
  // the window, the last target included. Packed documents then run alone, and an MTP target that lies in
  // another document than its position is left out (the main target after a document's last token is the next
  // document's first, as in the unpacked stream).
  LossOutput loss(const torch::Tensor& tokens, const torch::Tensor& targets, const torch::Tensor& doc_ids = {});
  // The same with the documents built already: docs (on the tokens' device; null: one sequence per row) and
  // window_docs, the doc_ids above as int64 on the tokens' device (undefined: MTP targets are not cut). A CUDA graph
  // of the training step (train/graph_step.h) passes its static buffers here.
  LossOutput loss(const torch::Tensor& tokens, const torch::Tensor& targets, const Documents* docs,
                  const torch::Tensor& window_docs);

  // A fresh inference state for batch sequences of up to capacity tokens. max_rollback bounds how many
  // tokens DecodeState::rollback may drop.
  DecodeState new_state(int64_t batch, int64_t capacity, int64_t max_rollback = 0) const;
  // Runs tokens [B, T] after what state holds (any number of chunks) and returns their logits [B, T, V].
  torch::Tensor prefill(const torch::Tensor& tokens, DecodeState& state);
  // The same, returning only the last token's logits [B, V]: generation needs no others, and the LM head over every
  // prompt token was most of a small model's prefill (a 32k-vocabulary head is a third of its weights).
  torch::Tensor prefill_last(const torch::Tensor& tokens, DecodeState& state);
  // One token per sequence, token [B]; returns logits [B, V].
  torch::Tensor decode(const torch::Tensor& token, DecodeState& state);
  // Greedy draft tokens [B, mtp depth] from the MTP modules: next_token [B] is the token chosen after the
  // state's last position; draft j guesses the token j+1 places after it. The main stack's caches and history stay
  // as they are; the modules keep their own caches in state.mtp (made by the first call, which runs the modules over
  // the whole history), so a call runs each module over the positions new since the last one and its speculative
  // ones only. Every row must hold state.length tokens.
  torch::Tensor draft(DecodeState& state, const torch::Tensor& next_token);

  // Every MoE sub-module (main stack and MTP modules), for router statistics and bias updates.
  std::vector<MoEImpl*> moe_modules() const;
  // The aux-loss-free balancing step of every MoE layer; call after each optimizer step.
  void update_balancing_biases();
  // Expert parallelism (training, train/distributed.h): every MoE layer keeps its share of the routed experts
  // (MoEImpl::spread_experts) and exchanges tokens through group. Call before an optimizer takes the parameters.
  void spread_experts(const std::shared_ptr<ExpertGroup>& group);
  // The ranks the routed experts are spread over (1: all experts here).
  int expert_parallel() const;
  // Activation checkpointing in training (recompute.h): the main stack's attention (without DSA), Mamba-3, M2RNN
  // and dense MLP blocks keep only their inputs and run again in the backward. MoE and DSA layers, whose forwards
  // record balance statistics, auxiliary losses or the indexers' KL loss, run as usual.
  void set_recompute(bool on) { recompute_ = on; }

  // The DSA indexer training stage of every DSA layer (Sparse when built): the trainer runs Warmup first with
  // only indexer_parameters() trainable.
  void set_dsa_stage(DsaStage stage);
  std::vector<torch::Tensor> indexer_parameters() const;

  // Engram modules by layer (null where a layer has none), registered as layers.{i}.engram.
  const std::vector<Engram>& engram_layers() const { return engram_; }
  // Learned mHC mixes by layer (null where a layer uses the plain mix), registered as layers.{i}.mhc.
  const std::vector<MhcMix>& mhc_layers() const { return mhc_; }
  // Installs a tokenizer's compression map (data::engram_canonical_map): map[id] in [0, vocab) for every id.
  void set_engram_canonical_ids(const std::vector<int64_t>& map);
  // Keeps every Engram table in host memory (true; only the gathered rows go to the device) or on the device.
  void set_engram_host_resident(bool host);
  // What decode (the main stack; MTP modules do not decode) can do: the first layer's reason for each refusal, and
  // Engram tables in host memory (gathered on the host) refuse graphs. The engine asks this, never the layers.
  DecodeSupport decode_support() const;

  Embedding embed{nullptr};
  torch::Tensor resid_lambdas, x0_lambdas;  // undefined with mHC
  torch::Tensor engram_canonical_ids;       // [V] int64 buffer, with Engram only (identity by default)
  MhcHead mhc_head{nullptr};                // with mHC only
  RMSNorm final_norm{nullptr};
  Linear lm_head{nullptr};

 private:
  using LayerFn = std::function<torch::Tensor(size_t, const torch::Tensor&)>;
  // The residual stack from x0 [B, T, D] to the hidden [B, T, D] before final_norm. block(l, x) runs layer l on
  // x [B, T, D]; memory(l, X) is layer l's Engram addition to X [B, T, n, D] (n = 1 without mHC). With
  // block_normed(l, h), layer l on its normed input h, the plain stack (no mHC) runs each layer without Engram from
  // the mix and norm computed together (ops::residual_mix_norm), the rest through block.
  torch::Tensor trunk(const torch::Tensor& x0, const LayerFn& block, const LayerFn& memory,
                      const LayerFn& block_normed = nullptr);
  torch::Tensor canonical(const torch::Tensor& tokens) const;
  torch::Tensor embed_tokens(const torch::Tensor& tokens);
  // The LM head's logits in FP32 (FP64 stays FP64); raw: in the head's own dtype (BF16 under autocast), for the fused
  // loss, which reads them without an FP32 copy.
  torch::Tensor head(const torch::Tensor& normed, bool raw = false);
  ModelOutput forward_impl(const torch::Tensor& tokens, const Documents* docs, bool raw);
  std::vector<torch::Tensor> mtp_impl(const torch::Tensor& tokens, const torch::Tensor& hidden, const Documents* docs,
                                      bool raw);
  torch::Tensor run_cached(const torch::Tensor& tokens, DecodeState& state, bool step, bool last_only = false);

  Recipe recipe_;
  ModelPlan plan_;
  bool recompute_ = false;
  torch::nn::ModuleList layer_list_{nullptr};
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<Engram> engram_;  // by layer, null where absent
  std::vector<MhcMix> mhc_;     // by layer, null where the layer uses the plain mix (or mHC is off)
  torch::nn::ModuleList mtp_list_{nullptr};
  std::vector<MtpModule> mtp_;
};

// Parameter counts of a built model, from its named_parameters (routed experts count k of N as active).
struct LayerSummary {
  int index = 0;
  char letter = 0;
  std::string class_name;
  std::string features;
  int64_t params = 0;
  int64_t active = 0;
};

struct ModelSummary {
  int64_t total = 0;  // main model (MTP excluded)
  int64_t active = 0;
  int64_t mtp_total = 0;
  int64_t engram_tables = 0;  // Engram table elements (not in total, as the accounting)
  int64_t buffers = 0;        // elements of non-parameter state (MoE balancing biases)
  int64_t bytes = 0;          // parameters and buffers in the dtype the model was built with
  std::vector<LayerSummary> layers;
};

ModelSummary summarize(const HybridLM& model);

}  // namespace slm::model
