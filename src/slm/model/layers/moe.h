#pragma once
// E: a fine-grained MoE channel layer, DeepSeek-V3 style. N routed SwiGLU experts (top-k per token) plus
// always-on shared expert(s); sigmoid affinities in fp32; the balancing bias changes selection only;
// dropless sort-by-expert dispatch.
#include <memory>
#include <optional>
#include <string>
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

// Each of the N*k assignments gathers its expert's weights from the stacked tensors (index_select) and all run as
// one batched matmul per projection: no sort, no per-expert loop, no host sync. It copies k*N expert matrices per
// call, so it is for decode-sized N. Dense weights only (an NVFP4 expert's codes cannot be multiplied by bmm).
torch::Tensor gathered_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts);

// NVFP4 experts (both projections) on the GPU: one NVFP4 GEMV launch per projection reads the experts in place by
// the ids on the device, no host sync, so a CUDA graph captures it. Each assignment reads its expert
// (nvfp4::gathered_linear_cuda); with more assignments than experts and experts of 128 KiB or more, they are sorted by
// expert on the device and each expert is read once for up to 16 of its rows (nvfp4::grouped_linear_cuda). For
// decode-sized N (the moe.nvfp4_gathered backend takes it for up to 128 assignments, and under capture).
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

// Every expert on every token, masked by the gate weights; the reference every backend must match.
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

// Stacked routed-expert weights: "w13" [E, 2f, D] ([gate; up] like SwiGLU), "w2" [E, D, f]; each dense or NVFP4
// (weight.h; an NVFP4 checkpoint's loader calls Weight::use_nvfp4 on them).
class ExpertsImpl : public torch::nn::Module {
 public:
  ExpertsImpl(int64_t num_experts, int64_t d_model, int64_t hidden, const torch::TensorOptions& options);
  // Experts held here: all of them, or this rank's share after keep_experts.
  int64_t num_experts() const { return num_experts_; }
  // Keeps experts [first, first + count) only (expert parallelism), in place: the parameters stay the same
  // tensors, so call it before an optimizer takes them.
  void keep_experts(int64_t first, int64_t count);
  // Expert e's SwiGLU on x [n, D], with the weights in their form (dense or NVFP4).
  torch::Tensor ffn(const torch::Tensor& x, int64_t e) const;
  // Whether the experts run NVFP4 weights (either projection), and whether both do (what the GPU's gathered NVFP4
  // kernels read, indexing the stacks by id).
  bool nvfp4() const { return w13.is_nvfp4() || w2.is_nvfp4(); }
  bool both_nvfp4() const { return w13.is_nvfp4() && w2.is_nvfp4(); }

  Weight w13, w2;

 private:
  int64_t num_experts_;
};
TORCH_MODULE(Experts);

// How an MoE layer runs its routed and shared experts. Each backend is one way, with one run() and a name that the
// profiler (a RecordFunction scope around run) and `MoEImpl::backend_names` show. The choice is made by one table,
// plan_experts, from facts that change only when weights load, the model moves, experts are spread or BF16 autocast
// is switched (ExpertsFacts); MoEImpl keeps the plan and picks again only when those facts change.
class ExpertsBackend {
 public:
  virtual ~ExpertsBackend() = default;
  virtual const char* name() const = 0;
  // Whether run reads nothing back to the host, so that a CUDA graph can capture it.
  virtual bool graph_safe() const = 0;
  // The routed experts' output for u [N, D] plus the shared expert's when the layer has one.
  virtual torch::Tensor run(const torch::Tensor& u, const Routing& routing) const = 0;
};

enum class ExpertsBackendKind {
  Loop,            // "moe.loop": loop_experts (the CPU; FP32/FP64 and NVFP4 prefill on the GPU)
  Grouped,         // "moe.grouped": grouped_experts, BF16 grouped GEMMs (GPU prefill and training)
  GatheredDecode,  // "moe.gathered_decode": a decode step's dense experts by id (MoEImpl's fused decode kernels, or
                   // gathered_experts where they do not take the call)
  Nvfp4Gathered,   // "moe.nvfp4_gathered": a decode step's NVFP4 experts by id (the fused kernels, or
                   // nvfp4_gathered_experts)
  ExpertParallel,  // "moe.expert_parallel": parallel_experts over the layer's expert group (training)
};

// The backend of one kind over these experts, shared expert (null: none) and, for ExpertParallel, group and the
// routed experts' total. It keeps pointers: the MoE layer that owns the experts outlives it.
std::unique_ptr<ExpertsBackend> make_experts_backend(ExpertsBackendKind kind, const ExpertsImpl& experts, SwiGLU shared,
                                                     ExpertGroup* group = nullptr, int64_t num_experts = 0);

// What the choice of backend depends on; all of it fixed between loads, moves, spreads and autocast switches.
struct ExpertsFacts {
  bool cuda = false;
  c10::ScalarType dtype = c10::ScalarType::Float;  // the dense expert weights' (kept when they are released)
  int nvfp4 = 0;                                   // projections in NVFP4: 0, 1 (per expert only) or 2 (stacked)
  bool bf16_autocast = false;                      // BF16 autocast on the GPU, as the trainer runs
  ExpertGroup* group = nullptr;
  bool operator==(const ExpertsFacts&) const = default;
};

// A layer's backends: `few` for calls of at most few_assignments assignments (N * k, a decode step's) and under CUDA
// graph capture where `many` is not graph safe; `many` for the rest.
struct ExpertsPlan {
  std::unique_ptr<ExpertsBackend> few, many;
  int64_t few_assignments = 0;
  const ExpertsBackend& for_call(const torch::Tensor& u, int64_t k) const;
};

// The one table: expert group -> expert-parallel; the CPU -> the loop; NVFP4 stacked on the GPU -> NVFP4 gathered for
// up to 128 assignments, else the loop; dense on the GPU -> gathered decode for up to 8 assignments, else grouped in
// BF16 (BF16 weights, or FP32 ones under BF16 autocast, with rows of multiples of 8 elements), else the loop.
ExpertsPlan plan_experts(const ExpertsFacts& facts, const ExpertsImpl& experts, SwiGLU shared, int64_t num_experts);

// The "moe" sub-module: router, stacked experts, shared expert, balancing bias buffer.
class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(const Recipe& recipe, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& h);  // h [B, T, D], already normalized
  // Routing and routed output of the dense reference path, for tests (same weights, same routing).
  torch::Tensor forward_reference(const torch::Tensor& h);

  Routing route_tokens(const torch::Tensor& u) const;
  // The backend forward runs for u [N, D] with this layer's top_k, from the plan for the current facts.
  const ExpertsBackend& experts_backend(const torch::Tensor& u);
  // The plan's backends for the current facts, "few (up to n assignments) / many", for logs and tests.
  std::string backend_names();
  ExpertsFacts facts() const;
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
  const ExpertsPlan& plan();
  ExpertsPlan plan_;
  std::optional<ExpertsFacts> planned_for_;
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
