#include "slm/model/layers/mamba3.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>

#include "slm/ops/swiglu.h"
#include "slm/util/error.h"

namespace slm::model {

namespace {

// The reference fixes the B/C and output norms' epsilon rather than taking the model's.
constexpr double kMamba3NormEps = 1e-5;

torch::ScalarType state_type(const torch::TensorOptions& o) {
  return o.dtype() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

}  // namespace

Mamba3Impl::Mamba3Impl(const Recipe& r, const torch::TensorOptions& options) {
  if (!r.mamba3)
    throw Error(r.source + ": pattern letter '" + std::string(1, pattern_letter(Family::Mamba3).letter) +
                "' needs a \"mamba3\" section");
  const auto& m = *r.mamba3;
  d_inner = m.d_inner;
  heads = m.heads;
  headdim = m.headdim;
  d_state = m.d_state;
  rank = m.rank();
  groups = m.ngroups;
  angles = m.rope_angles();
  chunk_size = m.chunk_size;
  a_floor = m.A_floor;
  if (heads * headdim != d_inner || heads % groups || angles < 1)
    throw Error(r.source + ": mamba3: inconsistent derived sizes (heads " + std::to_string(heads) + ", headdim " +
                std::to_string(headdim) + ", d_inner " + std::to_string(d_inner) + ", groups " +
                std::to_string(groups) + ", rotary angles " + std::to_string(angles) + ")");

  in_proj = register_module("in_proj", Linear(r.d_model, m.in_proj_width(r.d_model), options));
  torch::NoGradGuard no_grad;
  // Δ starts log-uniform in [dt_min, dt_max] (floored); dt_bias is its inverse softplus.
  auto dt = torch::exp(torch::rand({heads}, options) * (std::log(m.dt_max) - std::log(m.dt_min)) + std::log(m.dt_min))
                .clamp_min(m.dt_init_floor);
  dt_bias = register_parameter("dt_bias", dt + torch::log(-torch::expm1(-dt)));
  B_bias = register_parameter("B_bias", torch::ones({heads, rank, d_state}, options));
  C_bias = register_parameter("C_bias", torch::ones({heads, rank, d_state}, options));
  B_norm = register_module("B_norm", RMSNorm(d_state, kMamba3NormEps, options));
  C_norm = register_module("C_norm", RMSNorm(d_state, kMamba3NormEps, options));
  if (m.is_mimo) {
    mimo_x = register_parameter("mimo_x", torch::full({heads, rank, headdim}, 1.0 / rank, options));
    mimo_z = register_parameter("mimo_z", torch::ones({heads, rank, headdim}, options));
    mimo_o = register_parameter("mimo_o", torch::full({heads, rank, headdim}, 1.0 / rank, options));
  }
  D = register_parameter("D", torch::ones({heads}, options));
  if (m.is_outproj_norm) out_norm = register_module("out_norm", RMSNorm(d_inner, kMamba3NormEps, options));
  out_proj = register_module("out_proj", Linear(d_inner, r.d_model, options));
  out_proj->weight.dense().zero_();  // a fresh layer adds nothing to the residual stream, like the other mixers
}

ops::Mamba3Weights Mamba3Impl::weights() const {
  return {dt_bias, B_bias, C_bias, B_norm->weight, C_norm->weight, mimo_x, D, a_floor, kMamba3NormEps};
}

ops::Mamba3State Mamba3Impl::zero_state(int64_t batch) const {
  auto o = D.options().dtype(state_type(D.options()));
  return ops::mamba3_zero_state(batch, heads, headdim, d_state, rank, angles, o);
}

const char* Mamba3Backend::name() const {
  static const char* const names[3][2] = {
      {"mamba3.sequential+step", "mamba3.sequential+fused_step"},
      {"mamba3.chunked+step", "mamba3.chunked+fused_step"},
      {"mamba3.fused_scan+step", "mamba3.fused_scan+fused_step"},
  };
  return names[static_cast<int>(scan)][static_cast<int>(step)];
}

Mamba3Backend Mamba3Impl::pick(const Facts& f) const {
  using Scan = Mamba3Backend::Scan;
  using Step = Mamba3Backend::Step;
  Mamba3Backend b;
  if (ops::mamba3_fused_supported(f.cuda, f.dtype, headdim, d_state, angles, rank)) b.scan = Scan::Fused;
  // The fused step takes SISO layers (ops::mamba3_step_fusable): FP32 on the CPU; FP32 or BF16 with d_state a
  // multiple of 4 on the GPU of a CUDA build; at most d_state / 2 angles. It has no backward: a call that needs a
  // gradient runs the reference step (fused_step), which no training forward does (its sequences take the scan).
#ifdef SLM_WITH_CUDA
  const bool gpu_step = (f.dtype == torch::kFloat || f.dtype == torch::kBFloat16) && d_state % 4 == 0;
#else
  const bool gpu_step = false;
#endif
  const bool step_dtype = f.cuda ? gpu_step : f.dtype == torch::kFloat;
  if (!mimo_x.defined() && step_dtype && 2 * angles <= d_state) b.step = Step::Fused;
  return b;
}

const Mamba3Backend& Mamba3Impl::backend() {
  if (forced_) return *forced_;
  const Facts now{D.is_cuda(), D.scalar_type()};
  if (!picked_for_ || !(*picked_for_ == now)) {
    backend_ = pick(now);
    picked_for_ = now;
  }
  return backend_;
}

void Mamba3Impl::force_backend(std::optional<Mamba3Backend> forced) {
  forced_ = forced;
}

std::optional<std::pair<torch::Tensor, ops::Mamba3State>> Mamba3Impl::fused_step(const torch::Tensor& row,
                                                                                 const ops::Mamba3State& state,
                                                                                 const torch::Tensor& start,
                                                                                 bool in_place) {
  const auto w = weights();
  if (start.defined() || row.requires_grad() || !ops::mamba3_step_fusable(row, w, state)) return std::nullopt;
  return ops::mamba3_step_fused(row, step_layout(), w, state, in_place);
}

std::pair<torch::Tensor, ops::Mamba3State> Mamba3Impl::forward(const torch::Tensor& h, const ops::Mamba3State& state,
                                                               const torch::Tensor& start, bool state_in_place) {
  using Scan = Mamba3Backend::Scan;
  const int64_t b = h.size(0), t = h.size(1), bc = rank * groups * d_state;
  const auto proj = in_proj(h);
  const auto& backend = this->backend();
  RECORD_FUNCTION(backend.name(), std::vector<c10::IValue>());
  const auto z = proj.narrow(-1, 0, d_inner).view({b, t, heads, headdim});
  if (t == 1 && backend.step == Mamba3Backend::Step::Fused)
    if (auto y = fused_step(proj.view({b, -1}), state, start, state_in_place))
      return {gate(y->first, z, h.scalar_type()), std::move(y->second)};
  auto parts = proj.split_with_sizes({d_inner, d_inner, bc, bc, heads, heads, heads, angles}, -1);
  ops::Mamba3Projections p{parts[1].view({b, t, heads, headdim}),
                           parts[2].view({b, t, rank, groups, d_state}),
                           parts[3].view({b, t, rank, groups, d_state}),
                           parts[4],
                           parts[5],
                           parts[6],
                           parts[7]};
  const auto w = weights();
  auto [y, next] = [&] {
    if (t > 1 && backend.scan == Scan::Fused) return ops::mamba3_scan_fused(p, w, state, start);
    auto seq = ops::mamba3_preprocess(p, w, state.angle, start);
    if (backend.scan == Scan::Sequential) return ops::mamba3_scan_sequential(seq, state);
    return t == 1 ? ops::mamba3_step(seq, state) : ops::mamba3_scan_chunked(seq, state, chunk_size);
  }();
  return {gate(y, z, h.scalar_type()), next};
}

torch::Tensor Mamba3Impl::gate(const torch::Tensor& y, const torch::Tensor& z, torch::ScalarType dtype) {
  // SISO without the output norm (the recipes' form): one kernel each way on the GPU, in the projection's dtype.
  if (!out_norm && !mimo_z.defined() && z.scalar_type() == dtype && ops::silu_gate_fusable(y, z))
    return out_proj(ops::silu_gate(y, z));
  auto o = ops::mamba3_gate(y, z, mimo_z, mimo_o, out_norm ? out_norm->weight : torch::Tensor(), kMamba3NormEps);
  return out_proj(o.to(dtype));
}

std::pair<torch::Tensor, std::vector<ops::Mamba3State>> Mamba3Impl::steps(const torch::Tensor& h,
                                                                          const ops::Mamba3State& state) {
  const int64_t b = h.size(0), t = h.size(1);
  std::vector<ops::Mamba3State> states;
  const auto proj = in_proj(h);
  const auto w = weights();
  if (backend().step == Mamba3Backend::Step::Fused && !proj.requires_grad() &&
      ops::mamba3_step_fusable(proj.select(1, 0).contiguous(), w, state)) {
    std::vector<torch::Tensor> ys;
    for (int64_t i = 0; i < t; ++i) {
      auto [y, next] =
          ops::mamba3_step_fused(proj.select(1, i).contiguous(), step_layout(), w, i ? states.back() : state);
      ys.push_back(y);
      states.push_back(std::move(next));
    }
    return {gate(torch::cat(ys, 1), proj.narrow(-1, 0, d_inner).view({b, t, heads, headdim}), h.scalar_type()),
            std::move(states)};
  }
  return step_each([this](const torch::Tensor& x, const ops::Mamba3State& s) { return forward(x, s); }, h, state);
}

Mamba3Layer::Mamba3Layer(const Recipe& r, const torch::TensorOptions& options) : Layer(r.d_model, r.norm_eps, options) {
  mamba = register_module("mamba", Mamba3(r, options));
}

torch::Tensor Mamba3Layer::forward_normed(const torch::Tensor& h, const Documents* docs) {
  return mamba(h, mamba->zero_state(h.size(0)), docs ? docs->start : torch::Tensor()).first;
}

torch::Tensor Mamba3Layer::prefill(const torch::Tensor& x, LayerCache* cache) {
  auto* c = dynamic_cast<Mamba3Cache*>(cache);
  if (!c) throw Error("Mamba3Layer::prefill needs the Mamba3Cache its make_cache created");
  // A cache that keeps no earlier states (no rollback) lets a decode step update its state in place.
  const bool in_place = c->max_rollback() == 0;
  return run_recurrent(
      *c, norm(x),
      [this, in_place](const torch::Tensor& h, const ops::Mamba3State& s) {
        return mamba(h, s, torch::Tensor(), in_place);
      },
      [this](const torch::Tensor& h, const ops::Mamba3State& s) { return mamba->steps(h, s); });
}

std::unique_ptr<LayerCache> Mamba3Layer::make_cache(int64_t batch, int64_t, int64_t max_rollback) const {
  return std::make_unique<Mamba3Cache>(mamba->zero_state(batch), max_rollback);
}

}  // namespace slm::model
