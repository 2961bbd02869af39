#pragma once
// E: a fine-grained MoE channel layer, DeepSeek-V3 style. N routed SwiGLU experts (top-k per token) plus
// always-on shared expert(s); sigmoid affinities in fp32; the balancing bias changes selection only;
// dropless sort-by-expert dispatch.
#include <memory>
#include <optional>
#include <vector>

#include "slm/model/layer.h"
#include "slm/recipe/recipe.h"

namespace slm::model {

struct Routing {
  torch::Tensor scores;   // [N, E] sigmoid affinities (fp32, or fp64 for fp64 inputs); undefined from the fused
                          // kernel MoE takes outside training on CUDA (only the auxiliary loss reads them)
  torch::Tensor experts;  // [N, k] selected experts (int64)
  torch::Tensor weights;  // [N, k] gate weights: selected affinities normalized, times the scaling factor
};

// Top-k on scores + bias; the weights come from the unbiased scores.
Routing route(const torch::Tensor& router_logits, const torch::Tensor& bias, int64_t k, double scaling_factor);

class ExpertsImpl;

// Expert parallelism (training; train/distributed.h implements it over c10d): the routed experts of every MoE layer
// are spread over the `size()` ranks of a group, rank q holding experts [q L, (q + 1) L), L = experts / size(). A
// token's rows travel to its experts' ranks and back by all-to-all.
class ExpertGroup {
 public:
  virtual ~ExpertGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // All-to-all over dim 0: x's rows go out in rank order, send_rows[q] of them to rank q; the result holds
  // recv_rows[q] rows from each rank q, in rank order. Every rank of the group must call it, in the same order.
  // Not differentiable itself (parallel_experts wraps it in an autograd function).
  virtual torch::Tensor exchange(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                                 const std::vector<int64_t>& recv_rows) = 0;
};

// Routed-expert output for u [N, D]: assignments sorted by expert (dropless), each expert run on its
// contiguous slice, scaled by its gate and summed back per token. On CUDA with dense weights:
// gathered_experts for a decode step's few assignments (gathered_experts_pay), grouped_experts in BF16; NVFP4 experts
// on CUDA: nvfp4_gathered_experts for decode steps; loop_experts otherwise (fp32/fp64 prefill and training on CUDA,
// the CPU, NVFP4 prefill).
torch::Tensor dispatch_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts);

// Each of the N*k assignments gathers its expert's weights from the stacked tensors (index_select) and all run as
// one batched matmul per projection: no sort, no per-expert loop, no host sync. It copies k*N expert matrices per
// call, so it is for decode-sized N. Dense weights only (an NVFP4 expert's codes cannot be multiplied by bmm).
torch::Tensor gathered_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts);

// Whether dispatch_experts takes gathered_experts for u [N, D] with k experts per token: dense weights on CUDA and
// N*k <= 8 (the CPU measurements behind leaving the CPU out: bench/RESULTS.md, "Batch-1 decode").
bool gathered_experts_pay(const torch::Tensor& u, int64_t k, const ExpertsImpl& experts);

// NVFP4 experts (both projections) on the GPU: one NVFP4 GEMV launch per projection reads the experts in place by
// the ids on the device, no host sync, so a CUDA graph captures it. Each assignment reads its expert
// (nvfp4::gathered_linear_cuda); with more assignments than experts and experts of 128 KiB or more, they are sorted by
// expert on the device and each expert is read once for up to 16 of its rows (nvfp4::grouped_linear_cuda). For
// decode-sized N (dispatch_experts takes it for up to 128 assignments, and always under capture).
torch::Tensor nvfp4_gathered_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts);

// One matmul pair per expert that received tokens; reads the per-expert counts on the host (a sync).
torch::Tensor loop_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts);

// The routed output with the experts spread over group (num_experts in all, `experts` holding this rank's share):
// assignments sorted by expert, their rows sent to the experts' ranks (one all-to-all of the per-expert counts, read
// on the host, then one of the rows), run there grouped by expert (grouped GEMMs where grouped_experts would run,
// else the per-expert loop), sent back and combined. Gradients return through the same all-to-alls, so every rank
// of the group must run the forward and the backward of every MoE layer together.
torch::Tensor parallel_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts,
                               ExpertGroup& group, int64_t num_experts);

// All experts in one grouped GEMM per projection (at::_grouped_mm), computed in BF16 (u and the dense weights
// are cast, as BF16 autocast would) with no host sync; returns bf16. Runs on the CPU too, for tests.
torch::Tensor grouped_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts);

// Every expert on every token, masked by the gate weights; the reference dispatch_experts must match.
torch::Tensor dense_experts_reference(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts);

// Tokens routed to each expert, [E] int64, on the experts' device (no host sync).
torch::Tensor expert_load(const torch::Tensor& experts, int64_t num_experts);

// (max load - mean load) / mean load.
double max_violation(const torch::Tensor& load);

// Aux-loss-free balancing step: bias_e += rate * sign(mean(load) - load_e), in place.
void update_balancing_bias(torch::Tensor& bias, const torch::Tensor& load, double rate);

struct RouterStats {
  std::vector<int64_t> load;  // tokens per expert in the last forward
  double max_violation = 0.0;
};

// Stacked routed-expert weights: "w13" [E, 2f, D] ([gate; up] like SwiGLU), "w2" [E, D, f].
class ExpertsImpl : public torch::nn::Module {
 public:
  ExpertsImpl(int64_t num_experts, int64_t d_model, int64_t hidden, const torch::TensorOptions& options);
  // Experts held here: all of them, or this rank's share after keep_experts.
  int64_t num_experts() const { return num_experts_; }
  // Keeps experts [first, first + count) only (expert parallelism), in place: the parameters stay the same
  // tensors, so call it before an optimizer takes them.
  void keep_experts(int64_t first, int64_t count);
  // Expert e's SwiGLU on x [n, D], with the dense weights or, once use_nvfp4 ran, their NVFP4 matrices.
  torch::Tensor ffn(const torch::Tensor& x, int64_t e) const;
  // Inference on an NVFP4 checkpoint, as LinearImpl::use_nvfp4: which is "w13" or "w2", q its stacked tensor.
  void use_nvfp4(const std::string& which, nvfp4::QTensor q, const std::string& name);

  // Whether the experts run NVFP4 weights (use_nvfp4 ran for either projection).
  bool nvfp4() const { return q13_stacked.has_value() || q2_stacked.has_value(); }

  torch::Tensor w13, w2;
  std::vector<nvfp4::QTensor> q13, q2;  // one [out, in] matrix per expert when NVFP4, else empty
  // The same NVFP4 weights as one stack [E, out, in] (shared storage): the GPU's gathered path indexes it by id.
  std::optional<nvfp4::QTensor> q13_stacked, q2_stacked;

 private:
  int64_t num_experts_;
};
TORCH_MODULE(Experts);

// The "moe" sub-module: router, stacked experts, shared expert, balancing bias buffer.
class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(const Recipe& recipe, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& h);  // h [B, T, D], already normalized
  // Routing and routed output of the dense reference path, for tests (same weights, same routing).
  torch::Tensor forward_reference(const torch::Tensor& h);

  Routing route_tokens(const torch::Tensor& u) const;
  // Expert parallelism: keeps this rank's share of the experts and sends tokens through group from now on.
  void spread_experts(std::shared_ptr<ExpertGroup> group);
  const std::shared_ptr<ExpertGroup>& expert_group() const { return expert_group_; }
  RouterStats last_stats() const;
  // Loads accumulated over the training forwards since the last bias update (all-reduce this across ranks
  // before update_bias to balance on the global batch).
  torch::Tensor& pending_load() { return pending_load_; }
  // Applies the balancing step from the pending loads, then clears them. Call after each optimizer step.
  void update_bias();
  // Sequence-wise auxiliary loss of the last training forward (already weighted); undefined when off.
  const torch::Tensor& aux_loss() const { return aux_loss_; }

  int64_t num_experts, top_k;
  double scaling_factor, bias_rate, aux_weight;
  Linear router{nullptr};
  Experts experts{nullptr};
  SwiGLU shared{nullptr};
  torch::Tensor expert_bias;  // buffer, fp32

 private:
  torch::Tensor sequence_aux_loss(const Routing& routing, int64_t batch, int64_t seq) const;
  // A decode step's routed and shared experts on the GPU in two launches and the shared up projection
  // (ops::gathered_linear, ops::gathered_swiglu_combine); undefined where that does not apply.
  torch::Tensor fused_decode_experts(const torch::Tensor& u, const Routing& routing);
  torch::Tensor last_experts_, pending_load_, aux_loss_;
  std::shared_ptr<ExpertGroup> expert_group_;
};
TORCH_MODULE(MoE);

class MoELayer : public Layer {
 public:
  MoELayer(const Recipe& recipe, const torch::TensorOptions& options);
  Family family() const override { return Family::MoE; }
  const char* class_name() const override { return "MoELayer"; }
  torch::Tensor forward_normed(const torch::Tensor& h, const Documents* docs = nullptr) override;  // per token
  torch::Tensor prefill(const torch::Tensor& x, LayerCache* cache) override;
  std::unique_ptr<LayerCache> make_cache(int64_t, int64_t, int64_t) const override { return nullptr; }
  // Graphs need the stacked NVFP4 experts when the experts are NVFP4 (the per-expert loop counts on the host).
  DecodeSupport decode_support() const override;

  MoE moe{nullptr};
};

}  // namespace slm::model
