#include "slm/train/graph_step.h"

#include <torch/torch.h>

#include <algorithm>
#include <bit>

#include "slm/model/documents.h"
#include "slm/model/hybrid_lm.h"
#include "slm/train/device_batch.h"
#include "slm/util/autocast.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace slm::train {

std::string graph_step_blocker(const model::HybridLM& m, bool distributed, bool recompute) {
#ifndef SLM_WITH_CUDA
  (void)m;
  (void)distributed;
  (void)recompute;
  return "this build has no CUDA (SLM_CUDA=OFF)";
#else
  if (!m.embed->weight.is_cuda()) return "the model is on the CPU";
  if (distributed) return "data-parallel workers reduce gradients from hooks during the backward";
  if (recompute) return "activation checkpointing (--recompute) runs forwards inside the backward";
  for (const auto& l : m.plan().layers)
    if (l.dsa) return "DSA attention switches its parameters between trained and frozen by stage";
  return "";
#endif
}

struct GraphStep::Impl {
  model::HybridLM& model;
  int64_t rows, seq_len, accum;
  // The graph's inputs: tokens and targets [rows, T], the window's document ids [rows, T + 1] (int64) and the
  // Documents (cu_seqlens [capacity + 1]).
  torch::Tensor x, y, window;
  model::Documents docs;
  int64_t capacity = 0;
  torch::Tensor main;  // the graph's output
  // Per parameter, the gradient buffer the graph accumulates into (undefined where the backward does not reach).
  std::vector<torch::Tensor> grads;
  int64_t captures = 0;
#ifdef SLM_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif

  torch::Tensor forward_backward();
  void seat_gradients();
  void load(const DeviceBatch& b);
  void capture(const torch::Tensor& tokens, const torch::Tensor& doc_ids, int64_t documents);
};

GraphStep::GraphStep(model::HybridLM& m, int64_t rows, int64_t seq_len, int64_t accum) {
  if (const std::string why = graph_step_blocker(m, false, false); !why.empty())
    throw Error("CUDA graph training step: " + why);
  if (rows < 1 || seq_len < 1 || accum < 1)
    throw Error("CUDA graph training step: rows, seq_len and accum must be >= 1");
  impl_ = std::unique_ptr<Impl>(new Impl{m, rows, seq_len, accum, {}, {}, {}, {}, 0, {}, {}, 0});
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(m.embed->weight.device());
  impl_->x = torch::zeros({rows, seq_len}, opts);
  impl_->y = torch::zeros({rows, seq_len}, opts);
  impl_->window = torch::zeros({rows, seq_len + 1}, opts);
  impl_->docs.spans.id = torch::zeros({rows, seq_len}, opts);
  impl_->docs.pos = torch::zeros({rows, seq_len}, opts);
  impl_->docs.start = torch::zeros({rows, seq_len}, opts.dtype(torch::kBool));
  impl_->docs.spans.max_len = seq_len;
}

GraphStep::~GraphStep() = default;

int64_t GraphStep::captures() const {
  return impl_->captures;
}

int64_t GraphStep::document_capacity() const {
  return impl_->capacity;
}

void GraphStep::zero_grad() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : impl_->model.parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  if (!grads.empty()) at::_foreach_zero_(grads);
}

// The eager training step's forward and backward (train/trainer.cpp) on the static buffers. Autocast's weight cache
// is off: its casts would be made once, at the capture, and then read as stale copies by every replay.
torch::Tensor GraphStep::Impl::forward_backward() {
  model::LossOutput out;
  {
    const AutocastScope bf16(at::kCUDA, true, at::kBFloat16, /*cache=*/false);
    out = model.loss(x, y, &docs, window);
  }
  (out.total / static_cast<double>(accum)).backward();
  return out.main.detach();
}

// Whoever dropped or replaced a gradient since the capture (Optimizer::zero_grad, an eager backward), the graph
// still adds into its own buffers: they take the gradient's current value and become the parameter's gradient again.
void GraphStep::Impl::seat_gradients() {
  torch::NoGradGuard no_grad;
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined() || params[i].grad().is_same(grads[i])) continue;
    if (params[i].grad().defined())
      grads[i].copy_(params[i].grad());
    else
      grads[i].zero_();
    params[i].mutable_grad() = grads[i];
  }
}

// A staged batch into the static buffers, queued on the current stream after the previous replay that reads them.
void GraphStep::Impl::load(const DeviceBatch& b) {
  x.copy_(b.x);
  y.copy_(b.y);
  window.copy_(b.window);
  docs.spans.id.copy_(b.docs->spans.id);
  docs.pos.copy_(b.docs->pos);
  docs.start.copy_(b.docs->start);
  docs.spans.cu_seqlens.copy_(b.docs->spans.cu_seqlens);
}

torch::Tensor GraphStep::run(const torch::Tensor& tokens, const torch::Tensor& doc_ids) {
  auto& s = *impl_;
  if (tokens.dim() != 2 || tokens.size(0) != s.rows || tokens.size(1) != s.seq_len + 1 ||
      doc_ids.sizes() != tokens.sizes())
    throw Error("CUDA graph training step: expected tokens and document ids [" + std::to_string(s.rows) + ", " +
                std::to_string(s.seq_len + 1) + "]");
#ifdef SLM_WITH_CUDA
  std::optional<DeviceBatch> b;
  if (s.graph) b = stage_batch(tokens, doc_ids, s.x.device(), s.capacity);
  if (b)
    s.load(*b);
  else  // the first batch, or more documents than the graph's cu_seqlens hold
    s.capture(tokens, doc_ids, model::count_documents(doc_ids.narrow(1, 0, s.seq_len)));
  s.seat_gradients();
  s.graph->replay();
  return s.main;
#else
  throw Error("CUDA graph training step: this build has no CUDA");
#endif
}

void GraphStep::Impl::capture(const torch::Tensor& tokens, const torch::Tensor& doc_ids, int64_t documents) {
#ifdef SLM_WITH_CUDA
  const auto device = x.device();
  const c10::cuda::CUDAGuard guard(device);
  // Room for a quarter more documents than this batch holds, rounded up to a power of two: a batch of more
  // documents captures again (flash attention's grid grows with the count, so it is not simply made huge).
  graph.reset();
  capacity = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max(documents + documents / 4, rows))));
  docs.spans.cu_seqlens = torch::zeros({capacity + 1}, x.options().dtype(torch::kInt));
  load(*stage_batch(tokens, doc_ids, device, capacity));
  auto params = model.parameters();
  std::vector<torch::Tensor> kept(params.size()), loads;
  torch::cuda::synchronize(device.index());
  auto stream = c10::cuda::getStreamFromPool(false, device.index());
  {
    const c10::cuda::CUDAStreamGuard on_side(stream);
    // The warm-up runs the lazy one-off work outside the capture (library handles and workspaces of this stream,
    // kernel autotuning) and allocates every gradient that the backward reaches. What it adds to the gradients and
    // to the MoE balance loads is put back.
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].grad().defined()) kept[i] = params[i].grad().clone();
      for (auto* moe : model.moe_modules()) loads.push_back(moe->pending_load().clone());
    }
    forward_backward();
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = params[i].grad();
        if (!g.defined()) continue;
        if (kept[i].defined())
          g.copy_(kept[i]);
        else
          g.zero_();
      }
      grads.clear();
      for (const auto& p : params) grads.push_back(p.grad());
      const auto moes = model.moe_modules();
      for (size_t i = 0; i < moes.size(); ++i) moes[i]->pending_load().copy_(loads[i]);
    }
    stream.synchronize();
    kept.clear();
    loads.clear();
    // The warm-up's activations go back to the device before the graph's own pool takes as much again.
    c10::cuda::CUDACachingAllocator::emptyCache();
    graph = std::make_unique<at::cuda::CUDAGraph>();
    graph->capture_begin();
    main = forward_backward();
    graph->capture_end();
  }
  torch::cuda::synchronize(device.index());
  ++captures;
#else
  (void)tokens;
  (void)doc_ids;
  (void)documents;
#endif
}

}  // namespace slm::train
