#include "slm/model/layers/m2rnn.h"

#include <torch/torch.h>

#include <cmath>

#include "slm/ops/m2rnn_scan.h"
#include "slm/util/error.h"

namespace slm::model {

namespace {

// Backward memory holds one state per this many tokens plus one stretch being recomputed.
constexpr int64_t kCheckpointEvery = 64;
// The forget-gate time step starts like Mamba's Δ (reference §3.2 defers to §1.3's defaults).
constexpr double kDtMin = 1e-3, kDtMax = 0.1, kDtFloor = 1e-4;

}  // namespace

CausalConvImpl::CausalConvImpl(int64_t channels, int64_t kernel, const torch::TensorOptions& options) {
  // PyTorch's Conv1d default: U(±1/sqrt(fan_in)) with fan_in = kernel for a depthwise conv.
  const double bound = 1.0 / std::sqrt(static_cast<double>(kernel));
  torch::NoGradGuard no_grad;
  weight = register_parameter("weight", torch::empty({channels, 1, kernel}, options).uniform_(-bound, bound));
  bias = register_parameter("bias", torch::empty({channels}, options).uniform_(-bound, bound));
}

std::pair<torch::Tensor, torch::Tensor> CausalConvImpl::forward(const torch::Tensor& x, const torch::Tensor& state,
                                                                const torch::Tensor& pos) {
  const int64_t t = x.size(1), kernel = weight.size(2);
  auto full = torch::cat({state.to(x.scalar_type()), x.transpose(1, 2)}, 2);  // [B, C, kernel - 1 + T]
  // A few shifted multiply-adds: at::conv1d's backends cost far more per call than this on decode-sized inputs.
  auto y = bias.view({1, -1, 1});
  for (int64_t j = 0; j < kernel; ++j) {
    auto term = full.narrow(2, j, t) * weight.select(2, j).view({1, -1, 1});
    // Tap j reads the input kernel-1-j tokens back, which lies in the previous document when pos is smaller.
    if (pos.defined()) term = term * (pos >= kernel - 1 - j).to(term.scalar_type()).unsqueeze(1);
    y = y + term;
  }
  return {torch::silu(y).transpose(1, 2), full.narrow(2, t, kernel - 1)};
}

M2RNNImpl::M2RNNImpl(const Recipe& r, const torch::TensorOptions& options) {
  if (!r.m2rnn)
    throw Error(r.source + ": pattern letter '" + std::string(1, pattern_letter(Family::M2RNN).letter) +
                "' needs an \"m2rnn\" section");
  const auto& m = *r.m2rnn;
  heads = m.heads;
  qk_heads = m.qk_heads;
  k_dim = m.k_head_dim;
  v_dim = m.v_head_dim;
  if (heads < 1 || qk_heads < 1 || heads % qk_heads)
    throw Error(r.source + ": m2rnn: heads (" + std::to_string(heads) + ") must be a multiple of qk_heads (" +
                std::to_string(qk_heads) + ")");
  conv_channels = 2 * qk_heads * k_dim + heads * v_dim;
  in_proj = register_module("in_proj", Linear(r.d_model, conv_channels + heads + heads * v_dim, options));
  conv = register_module("conv", CausalConv(conv_channels, m.conv_kernel, options));
  torch::NoGradGuard no_grad;
  A_log = register_parameter("A_log", torch::log(torch::empty({heads}, options).uniform_(0, 16)));
  auto dt = torch::exp(torch::rand({heads}, options) * (std::log(kDtMax) - std::log(kDtMin)) + std::log(kDtMin))
                .clamp_min(kDtFloor);
  dt_bias = register_parameter("dt_bias", dt + torch::log(-torch::expm1(-dt)));
  // W = I: the state starts as a pure gated accumulator and learns its mixing.
  state_weight = register_parameter("state_weight", torch::eye(v_dim, options).repeat({heads, 1, 1}));
  D = register_parameter("D", torch::ones({heads, v_dim}, options));
  out_norm = register_module("out_norm", RMSNorm(heads * v_dim, r.norm_eps, options));
  out_proj = register_module("out_proj", Linear(heads * v_dim, r.d_model, options));
  out_proj->weight.dense().zero_();  // a fresh layer adds nothing to the residual stream, like the other mixers
}

M2RNNState M2RNNImpl::zero_state(int64_t batch) const {
  return {torch::zeros({batch, conv_channels, conv->weight.size(2) - 1}, D.options()),
          torch::zeros({batch, heads, k_dim, v_dim}, D.options())};
}

std::pair<torch::Tensor, M2RNNState> M2RNNImpl::forward(const torch::Tensor& h, const M2RNNState& state,
                                                        const Documents* docs) {
  const int64_t b = h.size(0), t = h.size(1), qk = qk_heads * k_dim;
  auto parts = in_proj(h).split_with_sizes({conv_channels, heads, heads * v_dim}, -1);
  auto [qkv, conv_state] = conv(parts[0], state.conv, docs ? docs->pos : torch::Tensor());
  auto qkv_parts = qkv.split_with_sizes({qk, qk, heads * v_dim}, -1);
  auto q = qkv_parts[0].reshape({b, t, qk_heads, k_dim}).repeat_interleave(heads / qk_heads, 2);
  auto k = qkv_parts[1].reshape({b, t, qk_heads, k_dim}).repeat_interleave(heads / qk_heads, 2);
  auto v = qkv_parts[2].reshape({b, t, heads, v_dim});
  auto f = torch::exp(-torch::exp(A_log) * torch::softplus(parts[1] + dt_bias));
  torch::Tensor y, next;
  if (t == 1) {
    std::tie(y, next) =
        ops::m2rnn_step(q.select(1, 0), k.select(1, 0), v.select(1, 0), f.select(1, 0), state_weight, D, state.h);
    y = y.unsqueeze(1);
  } else {
    std::tie(y, next) = ops::m2rnn_scan(q, k, v, f, state_weight, D, state.h, grad_clip, kCheckpointEvery,
                                        docs ? docs->start : torch::Tensor());
  }
  auto o = out_norm(y.reshape({b, t, heads * v_dim}) * torch::silu(parts[2]));
  return {out_proj(o), {conv_state, next}};
}

M2RNNLayer::M2RNNLayer(const Recipe& r, const torch::TensorOptions& options) : Layer(r.d_model, r.norm_eps, options) {
  m2rnn = register_module("m2rnn", M2RNN(r, options));
}

torch::Tensor M2RNNLayer::forward_normed(const torch::Tensor& h, const Documents* docs) {
  return m2rnn(h, m2rnn->zero_state(h.size(0)), docs).first;
}

torch::Tensor M2RNNLayer::prefill(const torch::Tensor& x, LayerCache* cache) {
  auto* c = dynamic_cast<M2RNNCache*>(cache);
  if (!c) throw Error("M2RNNLayer::prefill needs the M2RNNCache its make_cache created");
  return run_recurrent(*c, norm(x), [this](const torch::Tensor& h, const M2RNNState& s) { return m2rnn(h, s); });
}

std::unique_ptr<LayerCache> M2RNNLayer::make_cache(int64_t batch, int64_t, int64_t max_rollback) const {
  return std::make_unique<M2RNNCache>(m2rnn->zero_state(batch), max_rollback);
}

}  // namespace slm::model
