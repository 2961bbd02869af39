#include "slm/model/layers/moe.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <optional>

#include "slm/ops/gathered_linear.h"
#include "slm/ops/moe_combine.h"
#include "slm/ops/moe_route.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/util/error.h"

namespace slm::model {

namespace {
// Affinities are computed in fp32 at least (fp64 stays fp64 so gradient checks see exact arithmetic).
torch::ScalarType router_dtype(const torch::Tensor& u) {
  return u.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

}  // namespace

Routing route(const torch::Tensor& router_logits, const torch::Tensor& bias, int64_t k, double scaling_factor) {
  Routing r;
  r.scores = torch::sigmoid(router_logits);
  auto biased = r.scores.detach() + bias.to(r.scores.scalar_type());
  r.experts = std::get<1>(biased.topk(k, -1));
  auto selected = r.scores.gather(1, r.experts);
  r.weights = selected / selected.sum(-1, true) * scaling_factor;
  return r;
}

namespace {
// The k * N (token, slot) assignments sorted by expert, stable so each expert sees its tokens in order.
struct ByExpert {
  torch::Tensor order;  // [N*k] flat assignment index in sorted order
  torch::Tensor inv;    // [N*k] the inverse permutation: where each assignment sits in the sorted order
  torch::Tensor token;  // [N*k] the token of each sorted assignment
  torch::Tensor ends;   // [E] int32: where each expert's run ends in the sorted order (cumulative counts)
  int64_t k;
};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of x in the order of a permutation, y[i] = x[perm[i]], whose gradient is the inverse gather dx[j] =
// dy[inv[j]]: neither direction scatters (index_add, the autograd default, serializes on atomics on the GPU).
class PermuteRows : public torch::autograd::Function<PermuteRows> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& perm,
                               const torch::Tensor& inv) {
    ctx->save_for_backward({inv});
    return x.index_select(0, perm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0].index_select(0, ctx->get_saved_variables()[0]), {}, {}};
  }
};

// xs[i] = u[token[i]] for the sorted assignments; the gradient puts the rows back in assignment order (token n's k
// assignments adjacent) and sums each token's k of them: a gather and a reduction instead of a scatter-add.
class GatherTokens : public torch::autograd::Function<GatherTokens> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& u, const torch::Tensor& token,
                               const torch::Tensor& inv, int64_t k) {
    ctx->save_for_backward({inv});
    ctx->saved_data["k"] = k;
    return u.index_select(0, token);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto g = grads[0].index_select(0, ctx->get_saved_variables()[0]);
    return {g.view({-1, ctx->saved_data["k"].toInt(), g.size(1)}).sum(1), {}, {}, {}};
  }
};

ByExpert sort_by_expert(const torch::Tensor& experts, int64_t num_experts) {
  const int64_t k = experts.size(1);
  if (ops::expert_order_fusable(experts, num_experts)) {  // a decode step's few assignments: one kernel
    auto [order, inv, token, ends] = ops::expert_order_fused(experts, num_experts);
    return {order, inv, token, ends, k};
  }
  auto [sorted, order] = torch::sort(experts.reshape({-1}), /*stable=*/true, 0, /*descending=*/false);
  // searchsorted rather than bincount + cumsum: CUDA's bincount reads the ids' min and max back to the host.
  auto ends = torch::searchsorted(sorted, torch::arange(num_experts, sorted.options()), /*out_int32=*/true,
                                  /*right=*/true);
  auto inv = torch::empty_like(order).scatter_(0, order, torch::arange(order.numel(), order.options()));
  return {order, inv, order.div(k, "floor"), ends, k};
}

// Scales the expert outputs ys [N*k, D] (in sorted order) by their gates and sums them back per token, in the
// dtype the experts computed in (bf16 under autocast, where u may still be fp32).
torch::Tensor combine(const torch::Tensor& ys, const ByExpert& s, const Routing& routing, int64_t tokens) {
  if (ops::moe_combine_fusable(ys, s.inv, routing.weights)) return ops::moe_combine(ys, s.inv, routing.weights);
  auto per_token = PermuteRows::apply(ys, s.inv, s.order).view({tokens, s.k, ys.size(1)});
  // Autocast would run the sum in FP32 (and return FP32); the experts' dtype is kept, as the products were.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return (per_token * routing.weights.to(ys.scalar_type()).unsqueeze(-1)).sum(1);
}

torch::Tensor gather_tokens(const torch::Tensor& u, const ByExpert& s) {
  return GatherTokens::apply(u, s.token, s.inv, s.k);
}

// The grouped path runs where it pays: on the GPU (Hopper's grouped-GEMM kernel; older GPUs fall back inside
// ATen to a per-group loop that syncs), in BF16 (bf16 inputs, or fp32 ones under BF16 autocast, which the
// explicit casts in grouped_experts reproduce), with dense weights, and with the 16-byte-aligned row strides
// _grouped_mm requires (D and the hidden size multiples of 8 bf16 elements). plan_experts asks the same of the
// weights; parallel_experts of each call's rows.
bool use_grouped(const torch::Tensor& u, const ExpertsImpl& experts) {
  if (!u.is_cuda() || experts.nvfp4()) return false;
  const bool autocast_bf16 =
      at::autocast::is_autocast_enabled(at::kCUDA) && at::autocast::get_autocast_dtype(at::kCUDA) == at::kBFloat16;
  const bool bf16 = u.scalar_type() == torch::kBFloat16 || (autocast_bf16 && u.scalar_type() == torch::kFloat);
  return bf16 && experts.w2.dense().size(1) % 8 == 0 && experts.w2.dense().size(2) % 8 == 0;
}
}  // namespace

namespace {
// The experts on rows sorted by expert, ends[e] the end of expert e's run: one ffn per nonempty run.
torch::Tensor run_loop(const torch::Tensor& xs, const int32_t* ends, const ExpertsImpl& experts) {
  std::vector<torch::Tensor> outs;
  int64_t begin = 0;
  for (int64_t e = 0; e < experts.num_experts(); ++e) {
    if (ends[e] > begin) outs.push_back(experts.ffn(xs.narrow(0, begin, ends[e] - begin), e));
    begin = ends[e];
  }
  // No rows here (a rank whose experts got no tokens): the output stays on xs's autograd graph, so that the
  // backward still runs the exchanges every rank of an expert group waits for.
  return outs.empty() ? xs.clone() : torch::cat(outs, 0);
}

// The same in one grouped GEMM per projection, in BF16; ends on the device (int32), so no host sync. The weights are
// stored [E, out, in] like nn.Linear; _grouped_mm multiplies by [E, in, out] and takes the transposed
// (column-major) view as it is. The casts keep fp32 master weights receiving the gradients.
torch::Tensor run_grouped(const torch::Tensor& xs, const torch::Tensor& ends, const ExpertsImpl& experts) {
  auto w13 = experts.w13.dense().to(torch::kBFloat16).transpose(1, 2);
  auto w2 = experts.w2.dense().to(torch::kBFloat16).transpose(1, 2);
  return at::_grouped_mm(swiglu_activation(at::_grouped_mm(xs.to(torch::kBFloat16), w13, ends)), w2, ends);
}
}  // namespace

torch::Tensor loop_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts) {
  ByExpert s = sort_by_expert(routing.experts, experts.num_experts());
  auto ends = s.ends.cpu();  // the slices' sizes must be known on the host: one sync
  return combine(run_loop(gather_tokens(u, s), ends.data_ptr<int32_t>(), experts), s, routing, u.size(0));
}

torch::Tensor grouped_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts) {
  ByExpert s = sort_by_expert(routing.experts, experts.num_experts());
  return combine(run_grouped(gather_tokens(u.to(torch::kBFloat16), s), s.ends, experts), s, routing, u.size(0));
}

namespace {
// ExpertGroup::exchange with its gradient: the rows' gradients travel back by the reverse exchange. The group
// outlives every graph built through it (the model holds it), so ctx keeps it as an address.
class ExchangeRows : public torch::autograd::Function<ExchangeRows> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, ExpertGroup* group,
                               const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return group->exchange(x, send_rows, recv_rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<ExpertGroup*>(ctx->saved_data["group"].toInt());
    return {group->exchange(grads[0], ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector()),
            {},
            {},
            {}};
  }
};
}  // namespace

torch::Tensor parallel_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts,
                               ExpertGroup& group, int64_t num_experts) {
  const int ranks = group.size();
  const int64_t local = experts.num_experts();
  if (local * ranks != num_experts)
    throw Error("parallel_experts: " + std::to_string(ranks) + " ranks of " + std::to_string(local) +
                " experts do not hold the " + std::to_string(num_experts) + " routed experts");
  const bool grouped = use_grouped(u, experts);
  ByExpert s = sort_by_expert(routing.experts, num_experts);
  // BF16 rows on the grouped path: the experts compute in BF16 anyway, and half the bytes travel.
  auto xs = gather_tokens(grouped ? u.to(torch::kBFloat16) : u, s);

  // Rows per expert, sent to the experts' ranks: counts[q L + j] rows go to rank q's local expert j, and
  // recv[q L + j] arrive from rank q for local expert j. One host read for both.
  auto ends = s.ends.to(torch::kLong);
  auto counts = ends - torch::cat({torch::zeros({1}, ends.options()), ends.narrow(0, 0, num_experts - 1)});
  const std::vector<int64_t> per_rank(static_cast<size_t>(ranks), local);
  auto recv = group.exchange(counts.view({num_experts, 1}), per_rank, per_rank).view({num_experts});
  auto both = torch::cat({counts, recv}).cpu();
  const int64_t* sent_n = both.data_ptr<int64_t>();
  const int64_t* recv_n = sent_n + num_experts;
  std::vector<int64_t> send_rows(static_cast<size_t>(ranks), 0), recv_rows(static_cast<size_t>(ranks), 0);
  for (int q = 0; q < ranks; ++q)
    for (int64_t j = 0; j < local; ++j) {
      send_rows[static_cast<size_t>(q)] += sent_n[q * local + j];
      recv_rows[static_cast<size_t>(q)] += recv_n[q * local + j];
    }

  // The rows arrive by source rank, each source's by local expert; the experts want them by expert. perm lists the
  // arrived rows expert by expert (source ranks in order within each), local_ends where each expert's run ends.
  std::vector<int64_t> start(static_cast<size_t>(ranks) * static_cast<size_t>(local));
  int64_t at = 0;
  for (int q = 0; q < ranks; ++q)
    for (int64_t j = 0; j < local; ++j) {
      start[static_cast<size_t>(q * local + j)] = at;
      at += recv_n[q * local + j];
    }
  std::vector<int64_t> perm;
  perm.reserve(static_cast<size_t>(at));
  std::vector<int32_t> local_ends(static_cast<size_t>(local));
  for (int64_t j = 0; j < local; ++j) {
    for (int q = 0; q < ranks; ++q)
      for (int64_t r = 0; r < recv_n[q * local + j]; ++r) perm.push_back(start[static_cast<size_t>(q * local + j)] + r);
    local_ends[static_cast<size_t>(j)] = static_cast<int32_t>(perm.size());
  }
  auto idx = torch::tensor(perm, torch::kLong).to(u.device());
  auto inv = torch::empty_like(idx).scatter_(0, idx, torch::arange(idx.numel(), idx.options()));

  auto arrived = ExchangeRows::apply(xs, &group, send_rows, recv_rows);
  auto by_expert = PermuteRows::apply(arrived, idx, inv);
  auto ys = grouped ? run_grouped(by_expert, torch::tensor(local_ends, torch::kInt).to(u.device()), experts)
                    : run_loop(by_expert, local_ends.data(), experts);
  auto back = ExchangeRows::apply(PermuteRows::apply(ys, inv, idx), &group, recv_rows, send_rows);
  return combine(back, s, routing, u.size(0));
}

namespace {
// Sums the k expert outputs of each token, y [N*k, D] in assignment order, weighted by their gates.
torch::Tensor combine_assignments(const torch::Tensor& y, const Routing& routing) {
  const int64_t k = routing.experts.size(1);
  return (y.view({-1, k, y.size(1)}) * routing.weights.to(y.scalar_type()).unsqueeze(-1)).sum(1);
}
}  // namespace

torch::Tensor gathered_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts) {
  if (experts.nvfp4())
    throw Error("gathered_experts: the experts run NVFP4 weights, which bmm cannot read (use loop_experts)");
  const int64_t n = u.size(0), d = u.size(1), k = routing.experts.size(1);
  auto ids = routing.experts.reshape({-1});  // assignment i = token i / k, slot i % k
  if (ops::gathered_linear_fusable(u, experts.w13.dense()) && ops::gathered_linear_fusable(u, experts.w2.dense())) {
    // Inference on the GPU: each assignment reads its expert's matrices in place instead of copies of them.
    auto h = ops::gathered_linear(u, experts.w13.dense(), ids, k);
    return combine_assignments(ops::gathered_linear(swiglu_activation(h), experts.w2.dense(), ids, 1), routing);
  }
  auto x = u.unsqueeze(1).expand({n, k, d}).reshape({n * k, 1, d});
  // The stacked weights are [E, out, in] like nn.Linear: the gathered [N*k, out, in] transposed is bmm's right side.
  auto h = torch::bmm(x, experts.w13.dense().index_select(0, ids).transpose(1, 2));
  return combine_assignments(
      torch::bmm(swiglu_activation(h), experts.w2.dense().index_select(0, ids).transpose(1, 2)).view({n * k, d}),
      routing);
}

torch::Tensor nvfp4_gathered_experts(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts) {
  if (!experts.both_nvfp4()) throw Error("nvfp4_gathered_experts: both expert projections must run NVFP4 weights");
  const int64_t k = routing.experts.size(1);
  auto ids = routing.experts.reshape({-1});  // assignment i = token i / k, slot i % k
  // Sorted on the device so that each expert's weights are read once for all of its rows, where that pays: more
  // assignments than experts, and experts big enough that reading one again costs more than the sort's kernels. On
  // an H200 at 64 rows the grouped form took hybrid-250m's steps (288 KiB per expert's w13) from 6.30 to 5.65 ms and
  // the shipped specialists' (40.5 KiB) from 1.90 to 1.94 ms (bench/RESULTS.md); the bound sits between the two.
  constexpr int64_t kGroupedExpertBytes = 128 << 10;
  const bool grouped =
      ids.size(0) >= experts.num_experts() && experts.w13.bytes() / experts.num_experts() >= kGroupedExpertBytes;
  std::optional<ByExpert> s;
  if (grouped) s = sort_by_expert(routing.experts, experts.num_experts());
  // In u's dtype between the projections and after, as the per-expert loop's nvfp4 linears return it.
  auto project = [&](const torch::Tensor& x, const nvfp4::QTensor& w, int64_t x_div) {
    return s ? nvfp4::grouped_linear_cuda(x, w, s->order, s->ends, x_div, u.scalar_type())
             : nvfp4::gathered_linear_cuda(x, w, ids, x_div, u.scalar_type());
  };
  auto h = project(u, experts.w13.nvfp4(), k);
  auto y = project(swiglu_activation(h), experts.w2.nvfp4(), 1);
  return combine_assignments(y, routing);
}

torch::Tensor dense_experts_reference(const torch::Tensor& u, const Routing& routing, const ExpertsImpl& experts) {
  const int64_t num_experts = experts.num_experts();
  auto gates = torch::zeros({u.size(0), num_experts}, routing.weights.options())
                   .scatter(1, routing.experts, routing.weights)
                   .to(u.scalar_type());
  auto out = torch::zeros_like(u);
  for (int64_t e = 0; e < num_experts; ++e) out = out + gates.select(1, e).unsqueeze(1) * experts.ffn(u, e);
  return out;
}

torch::Tensor expert_load(const torch::Tensor& experts, int64_t num_experts) {
  // scatter_add rather than bincount, which on CUDA reads the ids' min and max back to the host.
  auto flat = experts.reshape({-1});
  return torch::zeros({num_experts}, flat.options()).scatter_add_(0, flat, torch::ones_like(flat));
}

double max_violation(const torch::Tensor& load) {
  auto l = load.to(torch::kDouble);
  double mean = l.mean().item<double>();
  return mean > 0 ? (l.max().item<double>() - mean) / mean : 0.0;
}

void update_balancing_bias(torch::Tensor& bias, const torch::Tensor& load, double rate) {
  torch::NoGradGuard no_grad;
  auto l = load.to(bias.device(), torch::kFloat);
  bias.add_(torch::sign(l.mean() - l).to(bias.scalar_type()), rate);
}

ExpertsImpl::ExpertsImpl(int64_t num_experts, int64_t d_model, int64_t hidden, const torch::TensorOptions& options)
    : num_experts_(num_experts) {
  w13 = Weight(register_parameter("w13", torch::empty({num_experts, 2 * hidden, d_model}, options)));
  w2 = Weight(register_parameter("w2", torch::zeros({num_experts, d_model, hidden}, options)));
  init_fan_in_uniform(w13.dense(), d_model);
}

void ExpertsImpl::keep_experts(int64_t first, int64_t count) {
  if (first < 0 || count < 1 || first + count > num_experts_)
    throw Error("keep_experts: experts [" + std::to_string(first) + ", " + std::to_string(first + count) +
                ") are not within the " + std::to_string(num_experts_) + " held");
  if (nvfp4()) throw Error("keep_experts: the experts run NVFP4 weights (inference only)");
  torch::NoGradGuard no_grad;
  // set_data keeps the registered parameter tensors (their identity) and swaps in the share, freeing the rest.
  for (auto* w : {&w13.dense(), &w2.dense()}) w->set_data(w->narrow(0, first, count).clone());
  num_experts_ = count;
}

torch::Tensor ExpertsImpl::ffn(const torch::Tensor& x, int64_t e) const {
  return w2.linear(swiglu_activation(w13.linear(x, e)), e);
}

MoEImpl::MoEImpl(const Recipe& r, const torch::TensorOptions& options)
    : num_experts(r.moe->routed_experts),
      top_k(r.moe->experts_per_token),
      scaling_factor(r.moe->routed_scaling_factor),
      bias_rate(r.moe->bias_update_rate),
      aux_weight(r.moe->aux_loss_weight) {
  const auto& m = *r.moe;
  router = register_module("router", Linear(r.d_model, num_experts, options));
  experts = register_module("experts", Experts(num_experts, r.d_model, m.expert_hidden, options));
  if (m.shared_experts > 0)
    shared = register_module("shared", SwiGLU(r.d_model, 1LL * m.shared_experts * m.shared_expert_hidden, options));
  auto f32 = options.dtype(torch::kFloat);
  expert_bias = register_buffer("expert_bias", torch::zeros({num_experts}, f32));
  pending_load_ = torch::zeros({num_experts}, f32.dtype(torch::kLong));
}

Routing MoEImpl::route_tokens(const torch::Tensor& u) const {
  auto dt = router_dtype(u);
  // FP32 logits: the one-row GEMV reads u and the weight as they are (no casts) where it applies.
  auto logits = dt == torch::kFloat ? ops::small_batch_linear_float(u, router->weight.dense())
                                    : at::linear(u.to(dt), router->weight.dense().to(dt));
  // Outside training nothing reads the affinities (the auxiliary loss): one kernel instead of about eight.
  if (!is_training() && ops::moe_route_fusable(logits, top_k)) {
    Routing r;
    std::tie(r.experts, r.weights) = ops::moe_route_fused(logits, expert_bias, top_k, scaling_factor);
    return r;
  }
  return route(logits, expert_bias, top_k, scaling_factor);
}

void MoEImpl::spread_experts(std::shared_ptr<ExpertGroup> group) {
  if (expert_group_) throw Error("spread_experts: the experts are spread already");
  const int ranks = group->size();
  if (ranks < 1 || num_experts % ranks != 0)
    throw Error("expert parallelism over " + std::to_string(ranks) + " ranks needs a multiple of " +
                std::to_string(ranks) + " routed experts (the recipe has " + std::to_string(num_experts) + ")");
  const int64_t local = num_experts / ranks;
  experts->keep_experts(group->rank() * local, local);
  expert_group_ = std::move(group);
}

torch::Tensor MoEImpl::sequence_aux_loss(const Routing& routing, int64_t batch, int64_t seq) const {
  // DeepSeek-V3 eq. 17-20: f_i = E/(k*T) * #selections of i in the sequence (constant), P_i = mean_t of the
  // normalized affinity; loss = weight * sum_i f_i * P_i, averaged over sequences.
  auto sel = torch::zeros({batch, num_experts}, routing.scores.options())
                 .scatter_add_(1, routing.experts.view({batch, seq * top_k}),
                               torch::ones({batch, seq * top_k}, routing.scores.options()));
  auto f = sel * (static_cast<double>(num_experts) / static_cast<double>(top_k * seq));
  auto s = routing.scores.view({batch, seq, num_experts});
  auto p = (s / s.sum(-1, true)).mean(1);
  return (f * p).sum(-1).mean() * aux_weight;
}

torch::Tensor MoEImpl::forward(const torch::Tensor& h) {
  const int64_t b = h.size(0), t = h.size(1), d = h.size(2);
  auto u = h.reshape({b * t, d});
  Routing routing = route_tokens(u);
  const auto& backend = experts_backend(u);
  torch::Tensor out;
  {
    RECORD_FUNCTION(backend.name(), std::vector<c10::IValue>());
    out = backend.run(u, routing);
  }
  last_experts_ = routing.experts;  // counted only when asked (last_stats): a decode step needs no counts
  if (is_training()) {
    torch::NoGradGuard no_grad;
    pending_load_ += expert_load(routing.experts, num_experts).to(pending_load_.device());
  }
  aux_loss_ = (is_training() && aux_weight > 0) ? sequence_aux_loss(routing, b, t) : torch::Tensor();
  return out.view({b, t, d});
}

ExpertsFacts MoEImpl::facts() const {
  const auto& e = *experts;
  ExpertsFacts f;
  f.cuda = e.w13.dense().is_cuda();
  f.dtype = e.w13.dense().scalar_type();
  f.nvfp4 = e.both_nvfp4() ? 2 : e.nvfp4() ? 1 : 0;
  f.bf16_autocast =
      at::autocast::is_autocast_enabled(at::kCUDA) && at::autocast::get_autocast_dtype(at::kCUDA) == at::kBFloat16;
  f.group = expert_group_.get();
  return f;
}

const ExpertsPlan& MoEImpl::plan() {
  // A handful of comparisons per call; the table runs again only after a load, a move, a spread or an autocast switch.
  const auto now = facts();
  if (!planned_for_ || !(*planned_for_ == now)) {
    plan_ = plan_experts(now, *experts, shared, num_experts);
    planned_for_ = now;
  }
  return plan_;
}

const ExpertsBackend& MoEImpl::experts_backend(const torch::Tensor& u) {
  return plan().for_call(u, top_k);
}

std::string MoEImpl::backend_names() {
  const auto& p = plan();
  if (std::string(p.few->name()) == p.many->name()) return p.many->name();
  return std::string(p.few->name()) + " (up to " + std::to_string(p.few_assignments) + " assignments) / " +
         p.many->name();
}

torch::Tensor MoEImpl::forward_reference(const torch::Tensor& h) {
  if (expert_group_) throw Error("MoE forward_reference: the experts are spread over ranks");
  const int64_t b = h.size(0), t = h.size(1), d = h.size(2);
  auto u = h.reshape({b * t, d});
  auto out = dense_experts_reference(u, route_tokens(u), *experts);
  if (shared) out = out + shared(u);
  return out.view({b, t, d});
}

RouterStats MoEImpl::last_stats() const {
  RouterStats s;
  auto l = last_experts_.defined() ? expert_load(last_experts_, num_experts).cpu()
                                   : torch::zeros({num_experts}, torch::kLong);
  s.load.assign(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
  s.max_violation = max_violation(l);
  return s;
}

void MoEImpl::update_bias() {
  update_balancing_bias(expert_bias, pending_load_, bias_rate);
  pending_load_.zero_();
}

MoELayer::MoELayer(const Recipe& r, const torch::TensorOptions& options) : Layer(r.d_model, r.norm_eps, options) {
  moe = register_module("moe", MoE(r, options));
}

torch::Tensor MoELayer::forward_normed(const torch::Tensor& h, const Documents*) {
  return moe(h);
}

DecodeSupport MoELayer::decode_support() const {
  const auto& e = *moe->experts;
  if (e.nvfp4() && !e.both_nvfp4())
    return {"", "routed experts with one projection in NVFP4 run per expert, counting on the host"};
  return {};
}

torch::Tensor MoELayer::prefill(const torch::Tensor& x, LayerCache*) {
  if (moe->expert_group())
    throw Error("MoE prefill: the experts are spread over ranks (expert parallelism trains only)");
  return moe(norm(x));
}

}  // namespace slm::model
