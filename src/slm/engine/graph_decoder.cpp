#include "slm/engine/graph_decoder.h"

#include <torch/torch.h>

#include "slm/model/hybrid_lm.h"
#include "slm/util/error.h"

#ifdef SLM_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace slm::engine {

std::string graph_decode_blocker(const model::HybridLM& m, const model::DecodeState& state) {
#ifndef SLM_WITH_CUDA
  (void)m;
  (void)state;
  return "this build has no CUDA (SLM_CUDA=OFF)";
#else
  if (!m.embed->weight.is_cuda()) return "the model is on the CPU";
  if (state.max_rollback > 0) return "the state keeps rollback history (max_rollback > 0)";
  return m.decode_support().cuda_graph;
#endif
}

#ifdef SLM_WITH_CUDA
struct GraphDecoder::Impl {
  model::HybridLM& model;
  model::DecodeState& state;
  at::cuda::CUDAGraph graph;
  torch::Tensor token, logits;
};

GraphDecoder::GraphDecoder(model::HybridLM& m, model::DecodeState& state) {
  if (const std::string why = graph_decode_blocker(m, state); !why.empty()) throw Error("CUDA graph decode: " + why);
  impl_ = std::unique_ptr<Impl>(new Impl{m, state, at::cuda::CUDAGraph(), {}, {}});
  const auto device = m.embed->weight.device();
  const c10::cuda::CUDAGuard guard(device);
  torch::NoGradGuard no_grad;
  impl_->token = torch::zeros({state.batch()}, torch::TensorOptions().dtype(torch::kLong).device(device));
  // Capture runs on a side stream; first the lazy one-off work (library handles, the rotary tables for the whole
  // capacity, the allocator's blocks) happens there outside the capture, on a scratch state.
  auto stream = c10::cuda::getStreamFromPool(false, device.index());
  torch::cuda::synchronize(device.index());
  {
    const c10::cuda::CUDAStreamGuard on_side(stream);
    {
      auto scratch = m.new_state(state.batch(), state.capacity());
      for (int i = 0; i < 2; ++i) m.decode(impl_->token, scratch);
    }
    stream.synchronize();
    impl_->graph.capture_begin();
    impl_->logits = m.decode(impl_->token, state);
    impl_->graph.capture_end();
  }
  torch::cuda::synchronize(device.index());
  // The capture ran the host's counting without the kernels.
  state.shift_length(-1);
}

GraphDecoder::~GraphDecoder() = default;

torch::Tensor GraphDecoder::step(const torch::Tensor& token) {
  auto& s = impl_->state;
  if (s.length + 1 > s.capacity())
    throw Error("decode state is full: " + std::to_string(s.length) + " + 1 tokens exceed capacity " +
                std::to_string(s.capacity()));
  if (token.dim() != 1 || token.size(0) != s.batch())
    throw Error("CUDA graph decode: expected one token per sequence, shape [" + std::to_string(s.batch()) + "]");
  impl_->token.copy_(token);
  impl_->graph.replay();
  s.shift_length(1);
  return impl_->logits;
}
#else
struct GraphDecoder::Impl {};

GraphDecoder::GraphDecoder(model::HybridLM& m, model::DecodeState& state) {
  throw Error("CUDA graph decode: " + graph_decode_blocker(m, state));
}

GraphDecoder::~GraphDecoder() = default;

torch::Tensor GraphDecoder::step(const torch::Tensor&) {
  throw Error("CUDA graph decode: this build has no CUDA");
}
#endif

}  // namespace slm::engine
