// The MoE layer's backends (moe.h, ExpertsBackend) and the one table that picks them, plan_experts.
#include <c10/core/ScalarType.h>
#include <torch/torch.h>

#include <functional>

#include "slm/model/layers/moe.h"
#include "slm/ops/gathered_linear.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace slm::model {

namespace {

// gathered_experts copies the weights of every assignment; loop_experts reads each selected expert once but sorts,
// reads the counts on the host and launches per expert. On the GPU the host read stalls the stream (and rules out
// CUDA graphs), so a decode step of up to this many assignments gathers. On the CPU the counts are read for free and
// the copy costs more than the loop's per-expert calls, 0.75x at one token of specialist-small (decode_bench
// --moe-paths, bench/RESULTS.md, "Batch-1 decode"): the CPU always loops.
constexpr int64_t kMaxGatheredAssignments = 8;
// NVFP4 experts are gathered up to the engine's largest decode batch (64 rows) at top-2; past it (prefill) the loop
// reads each expert once. Not measured in between.
constexpr int64_t kMaxGatheredNvfp4Assignments = 128;

bool capturing(const torch::Tensor& u) {
#ifdef SLM_WITH_CUDA
  return u.is_cuda() && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  (void)u;
  return false;
#endif
}

using SharedExpert = std::shared_ptr<SwiGLUImpl>;  // null: the layer has none

// A decode step's routed and shared experts in two launches and the shared up projection (ops::gathered_linear,
// ops::gathered_swiglu_combine), where the call fits the fused kernels (GPU, dtype, sizes); undefined elsewhere.
torch::Tensor fused_dense_decode(const torch::Tensor& u, const Routing& r, const ExpertsImpl& e,
                                 const SharedExpert& shared) {
  const int64_t k = r.experts.size(1);
  const auto& w13 = e.w13.dense();
  const auto& w2 = e.w2.dense();
  if (w13.size(1) != 2 * w2.size(2) || !ops::gathered_linear_fusable(u, w13)) return {};
  if (shared && (shared->w13->weight.is_nvfp4() || shared->w2->weight.is_nvfp4())) return {};
  const auto w_shared = shared ? shared->w2->weight.dense() : torch::Tensor();
  if (!ops::gathered_swiglu_combine_fusable(u, w2, k, w_shared)) return {};
  const auto ids = r.experts.reshape({-1});  // assignment i = token i / k, slot i % k
  return ops::gathered_swiglu_combine(ops::gathered_linear(u, w13, ids, k), w2, ids, r.weights,
                                      shared ? shared->w13->forward(u) : torch::Tensor(), w_shared);
}

// The same with NVFP4 experts and an NVFP4 shared expert (or none): the routed up projections gathered by id, the
// shared one, and the combine with the NVFP4 down projections in one launch; up to kMaxGatheredAssignments.
torch::Tensor fused_nvfp4_decode(const torch::Tensor& u, const Routing& r, const ExpertsImpl& e,
                                 const SharedExpert& shared) {
  const int64_t k = r.experts.size(1);
  if (u.size(0) * k > kMaxGatheredAssignments) return {};
  if (shared && !(shared->w13->weight.is_nvfp4() && shared->w2->weight.is_nvfp4())) return {};
  const auto w2 = nvfp4::as_stack(e.w2.nvfp4());
  const auto w_shared = shared ? nvfp4::as_stack(shared->w2->weight.nvfp4()) : ops::Nvfp4Stack{};
  if (!ops::gathered_swiglu_combine_nvfp4_fusable(u, w2, k, w_shared)) return {};
  const auto ids = r.experts.reshape({-1});  // assignment i = token i / k, slot i % k
  return ops::gathered_swiglu_combine_nvfp4(nvfp4::gathered_linear_cuda(u, e.w13.nvfp4(), ids, k, u.scalar_type()), w2,
                                            ids, r.weights, shared ? shared->w13->forward(u) : torch::Tensor(),
                                            w_shared);
}

// Every backend is this: a fused form of the routed and shared experts where it has one (undefined where the call
// does not fit its kernels), else its routed experts plus the shared expert.
class Backend final : public ExpertsBackend {
 public:
  using Form = std::function<torch::Tensor(const torch::Tensor&, const Routing&)>;
  Backend(const char* name, bool graph_safe, SharedExpert shared, Form routed, Form fused = {})
      : name_(name),
        graph_safe_(graph_safe),
        shared_(std::move(shared)),
        routed_(std::move(routed)),
        fused_(std::move(fused)) {}
  const char* name() const override { return name_; }
  bool graph_safe() const override { return graph_safe_; }
  torch::Tensor run(const torch::Tensor& u, const Routing& r) const override {
    if (fused_)
      if (auto y = fused_(u, r); y.defined()) return y;
    auto y = routed_(u, r);
    return shared_ ? y + shared_->forward(u) : y;
  }

 private:
  const char* name_;
  bool graph_safe_;
  SharedExpert shared_;
  Form routed_, fused_;
};

}  // namespace

std::unique_ptr<ExpertsBackend> make_experts_backend(ExpertsBackendKind kind, const ExpertsImpl& experts,
                                                     SwiGLU shared_module, ExpertGroup* group, int64_t num_experts) {
  const ExpertsImpl* e = &experts;
  SharedExpert shared = shared_module.is_empty() ? nullptr : shared_module.ptr();
  auto make = [&](const char* name, bool graph_safe, Backend::Form routed, Backend::Form fused = {}) {
    return std::make_unique<Backend>(name, graph_safe, shared, std::move(routed), std::move(fused));
  };
  switch (kind) {
    case ExpertsBackendKind::Loop:
      return make("moe.loop", false, [e](const torch::Tensor& u, const Routing& r) { return loop_experts(u, r, *e); });
    case ExpertsBackendKind::Grouped:
      if (experts.nvfp4()) throw Error("moe.grouped: the experts run NVFP4 weights, which _grouped_mm cannot read");
      return make("moe.grouped", true,
                  [e](const torch::Tensor& u, const Routing& r) { return grouped_experts(u, r, *e); });
    case ExpertsBackendKind::GatheredDecode:
      if (experts.nvfp4()) throw Error("moe.gathered_decode: the experts run NVFP4 weights (use moe.nvfp4_gathered)");
      return make(
          "moe.gathered_decode", true,
          [e](const torch::Tensor& u, const Routing& r) { return gathered_experts(u, r, *e); },
          [e, shared](const torch::Tensor& u, const Routing& r) { return fused_dense_decode(u, r, *e, shared); });
    case ExpertsBackendKind::Nvfp4Gathered:
      if (!experts.both_nvfp4()) throw Error("moe.nvfp4_gathered: both expert projections must run NVFP4 weights");
      return make(
          "moe.nvfp4_gathered", true,
          [e](const torch::Tensor& u, const Routing& r) { return nvfp4_gathered_experts(u, r, *e); },
          [e, shared](const torch::Tensor& u, const Routing& r) { return fused_nvfp4_decode(u, r, *e, shared); });
    case ExpertsBackendKind::ExpertParallel:
      if (!group) throw Error("moe.expert_parallel: the experts are not spread over an expert group");
      return make("moe.expert_parallel", false, [e, group, num_experts](const torch::Tensor& u, const Routing& r) {
        return parallel_experts(u, r, *e, *group, num_experts);
      });
  }
  throw Error("make_experts_backend: unknown backend kind");
}

const ExpertsBackend& ExpertsPlan::for_call(const torch::Tensor& u, int64_t k) const {
  if (u.size(0) * k <= few_assignments) return *few;
  // A stream being captured into a CUDA graph cannot read counts back: the few-row backend gathers without them.
  return !many->graph_safe() && capturing(u) ? *few : *many;
}

ExpertsPlan plan_experts(const ExpertsFacts& f, const ExpertsImpl& experts, SwiGLU shared, int64_t num_experts) {
  using K = ExpertsBackendKind;
  auto plan = [&](K few, int64_t few_assignments, K many) {
    ExpertsPlan p;
    p.few = make_experts_backend(few, experts, shared, f.group, num_experts);
    p.many = make_experts_backend(many, experts, shared, f.group, num_experts);
    p.few_assignments = few_assignments;
    return p;
  };
  if (f.group) return plan(K::ExpertParallel, 0, K::ExpertParallel);
  if (!f.cuda) return plan(K::Loop, 0, K::Loop);
  if (f.nvfp4 == 2) return plan(K::Nvfp4Gathered, kMaxGatheredNvfp4Assignments, K::Loop);
  if (f.nvfp4 == 1) return plan(K::Loop, 0, K::Loop);  // MoELayer::decode_support refuses graphs here
  const bool bf16 = f.dtype == c10::ScalarType::BFloat16 || (f.dtype == c10::ScalarType::Float && f.bf16_autocast);
  const bool aligned = experts.w2.dense().size(1) % 8 == 0 && experts.w2.dense().size(2) % 8 == 0;
  return plan(K::GatheredDecode, kMaxGatheredAssignments, bf16 && aligned ? K::Grouped : K::Loop);
}

}  // namespace slm::model
