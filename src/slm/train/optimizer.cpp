#include "slm/train/optimizer.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "slm/train/schedule.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/format.h"
#include "slm/util/json_reader.h"

namespace slm::train {

namespace {

// The real-valued config fields, so JSON reading, writing and range checks cannot drift apart.
struct DoubleField {
  const char* name;
  double OptimizerConfig::*member;
  double lo, hi;  // allowed closed range (hi excluded for momenta and betas: checked below)
  bool hi_open;
};

const std::vector<DoubleField>& double_fields() {
  constexpr double inf = HUGE_VAL;
  static const std::vector<DoubleField> f = {
      {"matrix_lr", &OptimizerConfig::matrix_lr, 0, inf, false},
      {"weight_decay", &OptimizerConfig::weight_decay, 0, inf, false},
      {"muon_momentum", &OptimizerConfig::muon_momentum, 0, 1, true},
      {"muon_momentum_start", &OptimizerConfig::muon_momentum_start, 0, 1, true},
      {"embed_lr", &OptimizerConfig::embed_lr, 0, inf, false},
      {"head_lr", &OptimizerConfig::head_lr, 0, inf, false},
      {"table_lr", &OptimizerConfig::table_lr, 0, inf, false},
      {"router_lr", &OptimizerConfig::router_lr, 0, inf, false},
      {"indexer_lr", &OptimizerConfig::indexer_lr, 0, inf, false},
      {"norm_lr", &OptimizerConfig::norm_lr, 0, inf, false},
      {"vector_lr", &OptimizerConfig::vector_lr, 0, inf, false},
      {"scalar_lr", &OptimizerConfig::scalar_lr, 0, inf, false},
      {"adamw_width_reference", &OptimizerConfig::adamw_width_reference, 0, inf, false},
      {"embed_weight_decay", &OptimizerConfig::embed_weight_decay, 0, inf, false},
      {"head_weight_decay", &OptimizerConfig::head_weight_decay, 0, inf, false},
      {"adam_beta1", &OptimizerConfig::adam_beta1, 0, 1, true},
      {"adam_beta2", &OptimizerConfig::adam_beta2, 0, 1, true},
      {"adam_embed_beta2", &OptimizerConfig::adam_embed_beta2, 0, 1, true},
      {"adam_eps", &OptimizerConfig::adam_eps, 0, inf, false},
  };
  return f;
}

torch::ScalarType parse_ns_dtype(const std::string& s, c10::Device device) {
  if (s == "auto") return slm::native_bf16_matmul(device) ? torch::kBFloat16 : torch::kFloat;
  if (s == "bfloat16") return torch::kBFloat16;
  if (s == "float32") return torch::kFloat;
  if (s == "float64") return torch::kDouble;
  throw Error("optimizer config: ns_dtype: expected \"auto\", \"bfloat16\", \"float32\" or \"float64\", got \"" + s + "\"");
}

double shape_scale(const std::string& variant, int64_t rows, int64_t cols) {
  const auto r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (variant == "moonlight") return 0.2 * std::sqrt(std::max(r, c));
  return std::sqrt(std::max(1.0, r / c));
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

void OptimizerConfig::validate() const {
  for (const auto& f : double_fields()) {
    const double v = this->*f.member;
    const bool ok = std::isfinite(v) && v >= f.lo && (f.hi_open ? v < f.hi : v <= f.hi);
    if (!ok)
      throw Error(std::string("optimizer config: ") + f.name + " must be in [" + fmt("%g", f.lo) + ", " +
                  fmt("%g", f.hi) + (f.hi_open ? ")" : "]") + ", got " + fmt("%g", v));
  }
  if (adam_eps <= 0) throw Error("optimizer config: adam_eps must be > 0");
  if (momentum_warmup_steps < 0) throw Error("optimizer config: momentum_warmup_steps must be >= 0");
  if (muon_stack_elements < 1) throw Error("optimizer config: muon_stack_elements must be >= 1");
  if (ns_steps < 1 || ns_steps > 20)
    throw Error("optimizer config: ns_steps must be in [1, 20], got " + std::to_string(ns_steps));
  if (ns_steps > ns_max_steps(parse_ns_coefficients(ns_coefficients)))
    throw Error("optimizer config: ns_steps: " + ns_coefficients + " has coefficients for at most " +
                std::to_string(ns_max_steps(parse_ns_coefficients(ns_coefficients))) + " steps, got " +
                std::to_string(ns_steps));
  parse_ns_dtype(ns_dtype, c10::Device(c10::kCPU));
  if (muon_shape_scale != "jordan" && muon_shape_scale != "moonlight")
    throw Error("optimizer config: muon_shape_scale: expected \"jordan\" or \"moonlight\", got \"" + muon_shape_scale +
                "\"");
}

nlohmann::json OptimizerConfig::to_json() const {
  nlohmann::json j;
  for (const auto& f : double_fields()) j[f.name] = this->*f.member;
  j["momentum_warmup_steps"] = momentum_warmup_steps;
  j["ns_steps"] = ns_steps;
  j["ns_coefficients"] = ns_coefficients;
  j["ns_dtype"] = ns_dtype;
  j["muon_shape_scale"] = muon_shape_scale;
  j["muon_stack_elements"] = muon_stack_elements;
  return j;
}

OptimizerConfig OptimizerConfig::from_json(const nlohmann::json& j, const std::string& source) {
  JsonObjectReader r(j, "", source);
  OptimizerConfig c;
  for (const auto& f : double_fields()) c.*f.member = r.get_double(f.name, c.*f.member);
  c.momentum_warmup_steps = r.get_int("momentum_warmup_steps", c.momentum_warmup_steps);
  c.ns_steps = static_cast<int>(r.get_int("ns_steps", c.ns_steps));
  c.ns_coefficients = r.get_string("ns_coefficients", c.ns_coefficients);
  c.ns_dtype = r.get_string("ns_dtype", c.ns_dtype);
  c.muon_shape_scale = r.get_string("muon_shape_scale", c.muon_shape_scale);
  c.muon_stack_elements = r.get_int("muon_stack_elements", c.muon_stack_elements);
  r.reject_unknown_keys();
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  return c;
}

std::string param_group(const ParamSpec& spec) {
  switch (spec.kind) {
    case ParamKind::Linear:
    case ParamKind::Expert:
    case ParamKind::Mixing: return "matrix";
    case ParamKind::Embedding: return "embedding";
    case ParamKind::Head: return "head";
    case ParamKind::Router: return "router";
    case ParamKind::Indexer: return "indexer";
    case ParamKind::Norm: return "norm";
    case ParamKind::Vector:
    case ParamKind::Conv: return "vector";
    case ParamKind::Scalar: return "scalar";
    case ParamKind::Table: return "table";
  }
  throw Error("optimizer: parameter " + spec.name + " has an unknown kind");
}

const std::vector<std::string>& group_names() {
  static const std::vector<std::string> names = {"matrix", "embedding", "head",   "router", "indexer",
                                                 "norm",   "vector",    "scalar", "table"};
  return names;
}

Algorithm group_algorithm(const std::string& group) {
  return group == "matrix" ? Algorithm::Muon : Algorithm::AdamW;
}

Optimizer::Optimizer(slm::model::HybridLM& model, OptimizerConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  ns_coefficients_ = parse_ns_coefficients(cfg_.ns_coefficients);
  // The model is on its training device by now; "auto" is decided for that device once.
  const auto params = model.parameters();
  ns_dtype_ = parse_ns_dtype(cfg_.ns_dtype, params.empty() ? c10::Device(c10::kCPU) : params.front().device());
  const Recipe& recipe = model.recipe();
  const Accounting acc = account(recipe, model.plan());
  std::map<std::string, const ParamSpec*> specs;
  for (const auto& s : acc.params) specs[s.name] = &s;

  const double width = cfg_.adamw_width_reference > 0
                           ? std::sqrt(cfg_.adamw_width_reference / static_cast<double>(recipe.d_model))
                           : 1.0;
  auto make_group = [&](const std::string& name) {
    ParamGroup g;
    g.name = name;
    g.algorithm = group_algorithm(name);
    g.beta1 = cfg_.adam_beta1;
    g.beta2 = cfg_.adam_beta2;
    if (name == "matrix")
      g.lr = cfg_.matrix_lr, g.weight_decay = cfg_.weight_decay, g.beta1 = g.beta2 = 0;
    else if (name == "embedding")
      g.lr = cfg_.embed_lr * width, g.weight_decay = cfg_.embed_weight_decay, g.beta2 = cfg_.adam_embed_beta2;
    else if (name == "head")
      g.lr = cfg_.head_lr * width, g.weight_decay = cfg_.head_weight_decay;
    else if (name == "table")
      g.lr = cfg_.table_lr * width, g.beta2 = cfg_.adam_embed_beta2;
    else if (name == "router")
      g.lr = cfg_.router_lr;
    else if (name == "indexer")
      g.lr = cfg_.indexer_lr, g.weight_decay = cfg_.weight_decay;
    else if (name == "norm")
      g.lr = cfg_.norm_lr;
    else if (name == "vector")
      g.lr = cfg_.vector_lr;
    else if (name == "scalar")
      g.lr = cfg_.scalar_lr;
    return g;
  };
  std::map<std::string, size_t> group_index;
  std::vector<ParamGroup> all;
  for (const auto& name : group_names()) {
    group_index[name] = all.size();
    all.push_back(make_group(name));
  }

  std::set<std::string> seen;
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& value = item.value();
    auto it = specs.find(name);
    if (it == specs.end())
      throw Error("optimizer: model parameter " + name + " is not in the recipe's parameter accounting");
    const ParamSpec& spec = *it->second;
    std::vector<int64_t> shape(spec.shape.begin(), spec.shape.end());
    if (spec.kind == ParamKind::Expert) shape[0] /= model.expert_parallel();  // this rank's share of the experts
    if (value.sizes().vec() != shape)
      throw Error("optimizer: parameter " + name + " has shape " + shape_text(value) + ", the recipe says " +
                  shape_text(shape));
    if (value.scalar_type() != torch::kFloat && value.scalar_type() != torch::kDouble)
      throw Error("optimizer: parameter " + name + " is " + std::string(c10::toString(value.scalar_type())) +
                  "; the optimizer keeps FP32 master weights (build the model in float32 or float64)");
    seen.insert(name);
    Param p;
    p.name = name;
    p.value = value;
    p.group = group_index.at(param_group(spec));
    auto& g = all[p.group];
    torch::NoGradGuard no_grad;
    if (g.algorithm == Algorithm::Muon) {
      if (value.dim() < 2) throw Error("optimizer: Muon parameter " + name + " is not a matrix: " + shape_text(value));
      p.momentum = torch::zeros_like(value, torch::MemoryFormat::Contiguous);
      const int64_t rows = value.size(-2), cols = value.size(-1), count = value.numel() / (rows * cols);
      for (int64_t k = 0; k < count; ++k) matrices_.push_back({params_.size(), k, rows, cols});
    } else {
      p.exp_avg = torch::zeros_like(value, torch::MemoryFormat::Contiguous);
      p.exp_avg_sq = torch::zeros_like(value, torch::MemoryFormat::Contiguous);
      p.step = torch::zeros({}, torch::kLong);
    }
    g.params.push_back(params_.size());
    params_.push_back(std::move(p));
  }
  for (const auto& s : acc.params)
    if (!seen.count(s.name)) throw Error("optimizer: the recipe's parameter " + s.name + " is missing from the model");
  for (auto& g : all)
    if (!g.params.empty()) groups_.push_back(std::move(g));
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t pi : groups_[gi].params) params_[pi].group = gi;
}

double Optimizer::momentum() const {
  return momentum_warmup(steps_, cfg_.muon_momentum_start, cfg_.muon_momentum, cfg_.momentum_warmup_steps);
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.value.mutable_grad() = torch::Tensor();
}

void Optimizer::set_group_scale(const std::string& group, double scale) {
  if (!std::isfinite(scale) || scale < 0)
    throw Error("optimizer: group scale must be finite and >= 0, got " + fmt("%g", scale));
  for (auto& g : groups_)
    if (g.name == group) {
      g.scale = scale;
      return;
    }
  throw Error("optimizer: no parameter group named \"" + group + "\" in this model");
}

void Optimizer::step(double lr_multiplier) {
  step(lr_multiplier, MuonShard{});
}

void Optimizer::step(double lr_multiplier, const MuonShard& shard) {
  if (!std::isfinite(lr_multiplier) || lr_multiplier < 0)
    throw Error("optimizer: LR multiplier must be finite and >= 0, got " + fmt("%g", lr_multiplier));
  if (shard.world_size < 1 || shard.rank < 0 || shard.rank >= shard.world_size)
    throw Error("optimizer: bad Muon shard rank " + std::to_string(shard.rank) + " of " +
                std::to_string(shard.world_size));
  // Per Muon parameter, the matrix indices this rank owns.
  std::vector<std::vector<int64_t>> owned(params_.size());
  if (!shard.owners.empty() && shard.owners.size() != matrices_.size())
    throw Error("optimizer: Muon shard names owners of " + std::to_string(shard.owners.size()) +
                " matrices, the model has " + std::to_string(matrices_.size()));
  const std::vector<int> owners = !shard.owners.empty()  ? shard.owners
                                  : shard.world_size > 1 ? assign_muon_owners(matrices_, shard.world_size)
                                                         : std::vector<int>(matrices_.size(), 0);
  for (size_t i = 0; i < matrices_.size(); ++i)
    if (owners[i] == shard.rank) owned[matrices_[i].param].push_back(matrices_[i].index);

  const double mu = momentum();
  torch::NoGradGuard no_grad;
  MuonBatches batches;
  for (const auto& g : groups_) {
    const double lr = g.lr * lr_multiplier * g.scale;
    if (g.scale == 0) continue;  // frozen: no state moves either
    std::vector<Param*> adamw;
    for (size_t pi : g.params) {
      Param& p = params_[pi];
      if (!p.value.grad().defined()) continue;
      if (g.algorithm == Algorithm::Muon)
        muon_momentum(p, g, lr, mu, owned[pi], batches);
      else
        adamw.push_back(&p);
    }
    adamw_steps(adamw, g, lr);
  }
  muon_apply(batches);
  ++steps_;
}

void Optimizer::adamw_steps(const std::vector<Param*>& ps, const ParamGroup& g, double lr) {
  // One multi-tensor (_foreach) launch per operation for all of a group's parameters at the same step count (which
  // share their bias corrections; normally the whole group): per parameter, each of the eight operations was its
  // own kernel launch, and on a GPU the launches, not the arithmetic, were the cost.
  std::map<int64_t, std::vector<Param*>> by_step;
  for (Param* p : ps) {
    p->step.add_(1);  // a host tensor: reading it back costs no device synchronisation
    by_step[p->step.item<int64_t>()].push_back(p);
  }
  for (const auto& [step, list] : by_step) {
    std::vector<torch::Tensor> values, grads, m, v;
    for (Param* p : list) {
      values.push_back(p->value);
      grads.push_back(p->value.grad().to(p->exp_avg.scalar_type()));
      m.push_back(p->exp_avg);
      v.push_back(p->exp_avg_sq);
    }
    const auto t = static_cast<double>(step);
    const double bias1 = 1.0 - std::pow(g.beta1, t), bias2 = 1.0 - std::pow(g.beta2, t);
    if (g.weight_decay != 0) at::_foreach_mul_(values, 1.0 - lr * g.weight_decay);
    at::_foreach_mul_(m, g.beta1);
    at::_foreach_add_(m, grads, 1.0 - g.beta1);
    at::_foreach_mul_(v, g.beta2);
    at::_foreach_addcmul_(v, grads, grads, 1.0 - g.beta2);
    auto denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, std::sqrt(bias2));
    at::_foreach_add_(denom, cfg_.adam_eps);
    at::_foreach_addcdiv_(values, m, denom, -lr / bias1);
  }
}

void Optimizer::muon_momentum(Param& p, const ParamGroup& g, double lr, double mu, const std::vector<int64_t>& owned,
                              MuonBatches& batches) {
  const int64_t rows = p.value.size(-2), cols = p.value.size(-1), count = p.value.numel() / (rows * cols);
  const torch::Tensor grad = p.value.grad().reshape({count, rows, cols});
  const torch::Tensor buf = p.momentum.view({count, rows, cols});
  // Owned indices come sorted; each contiguous run is updated at once.
  for (size_t i = 0; i < owned.size();) {
    size_t j = i + 1;
    while (j < owned.size() && owned[j] == owned[j - 1] + 1) ++j;
    const int64_t begin = owned[i], len = static_cast<int64_t>(j - i);
    buf.narrow(0, begin, len)
        .lerp_(grad.narrow(0, begin, len).to(buf.scalar_type()), 1.0 - mu);  // B <- mu B + (1-mu) G
    batches[{rows, cols}].push_back({&p, begin, len, lr, g.weight_decay, mu});
    i = j;
  }
}

void Optimizer::muon_apply(const MuonBatches& batches) {
  // NS runs on stacks of same-shape matrices from different parameters: on GPU a small matrix costs as much as
  // a large one (kernel launches, bench/RESULTS.md), so stacking saves most of the time. Stacks are capped so
  // the extra memory stays bounded (muon_stack_elements; the Nesterov updates exist for one stack at a time).
  for (const auto& [shape, runs] : batches) {
    const auto [rows, cols] = shape;
    const int64_t per_stack = std::max<int64_t>(1, cfg_.muon_stack_elements / (rows * cols));
    const double scale = shape_scale(cfg_.muon_shape_scale, rows, cols);
    std::vector<MuonRun> stack;
    int64_t stacked = 0;
    auto flush = [&] {
      std::vector<torch::Tensor> updates;
      for (const auto& r : stack) {
        const auto g = r.param->value.grad().reshape({-1, rows, cols}).narrow(0, r.begin, r.len);
        const auto b = r.param->momentum.view({-1, rows, cols}).narrow(0, r.begin, r.len);
        updates.push_back(g.to(b.scalar_type()).lerp(b, r.mu));  // U = (1 - mu) G + mu B
      }
      const auto o = newton_schulz(updates.size() == 1 ? updates[0] : torch::cat(updates), cfg_.ns_steps,
                                   ns_coefficients_, ns_dtype_);
      int64_t at = 0;
      for (const auto& r : stack) {
        auto w = r.param->value.view({-1, rows, cols}).narrow(0, r.begin, r.len);
        if (r.weight_decay != 0) w.mul_(1.0 - r.lr * r.weight_decay);
        w.add_(o.narrow(0, at, r.len).to(w.scalar_type()), -r.lr * scale);
        at += r.len;
      }
      stack.clear();
      stacked = 0;
    };
    for (const auto& run : runs)
      for (int64_t begin = run.begin; begin < run.begin + run.len;) {
        const int64_t len = std::min(run.begin + run.len - begin, per_stack - stacked);
        MuonRun piece = run;
        piece.begin = begin;
        piece.len = len;
        stack.push_back(piece);
        stacked += len;
        begin += len;
        if (stacked == per_stack) flush();
      }
    if (!stack.empty()) flush();
  }
}

std::string Optimizer::describe(bool verbose) const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-10s %-6s %8s %10s %10s %8s\n", "group", "opt", "tensors", "params", "lr", "wd");
  out << line;
  int64_t total_tensors = 0, total_params = 0;
  for (const auto& g : groups_) {
    int64_t n = 0;
    for (size_t pi : g.params) n += params_[pi].value.numel();
    total_tensors += static_cast<int64_t>(g.params.size());
    total_params += n;
    std::snprintf(line, sizeof line, "%-10s %-6s %8zu %10s %10.4g %8.4g\n", g.name.c_str(),
                  g.algorithm == Algorithm::Muon ? "muon" : "adamw", g.params.size(), human_count(n).c_str(),
                  g.lr * g.scale, g.weight_decay);
    out << line;
    if (verbose)
      for (size_t pi : g.params) out << "    " << params_[pi].name << " " << shape_text(params_[pi].value) << "\n";
  }
  std::snprintf(line, sizeof line, "%-10s %-6s %8lld %10s\n", "total", "", static_cast<long long>(total_tensors),
                human_count(total_params).c_str());
  out << line;
  out << "muon: " << matrices_.size() << " matrices, Nesterov momentum " << cfg_.muon_momentum_start << " -> "
      << cfg_.muon_momentum << " over " << cfg_.momentum_warmup_steps << " steps, " << cfg_.ns_steps << " "
      << cfg_.ns_coefficients << " Newton-Schulz steps in " << cfg_.ns_dtype << ", lr " << cfg_.matrix_lr << " x "
      << (cfg_.muon_shape_scale == "jordan" ? "sqrt(max(1, rows/cols))" : "0.2 sqrt(max(rows, cols))") << "\n";
  return out.str();
}

std::vector<std::pair<std::string, torch::Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : params_) {
    if (p.momentum.defined()) {
      out.emplace_back("muon.momentum/" + p.name, p.momentum);
    } else {
      out.emplace_back("adamw.exp_avg/" + p.name, p.exp_avg);
      out.emplace_back("adamw.exp_avg_sq/" + p.name, p.exp_avg_sq);
      out.emplace_back("adamw.step/" + p.name, p.step);
    }
  }
  return out;
}

nlohmann::json Optimizer::state_json() const {
  nlohmann::json scales = nlohmann::json::object();
  for (const auto& g : groups_) scales[g.name] = g.scale;
  return {{"step", steps_}, {"config", cfg_.to_json()}, {"group_scales", scales}};
}

void Optimizer::load_state(const std::map<std::string, torch::Tensor>& tensors, const nlohmann::json& meta) {
  // Check everything first, so that a bad checkpoint leaves this optimizer untouched.
  const auto expected = state_tensors();
  std::set<std::string> names;
  for (const auto& [name, target] : expected) {
    names.insert(name);
    auto it = tensors.find(name);
    if (it == tensors.end()) throw Error("optimizer state: tensor " + name + " is missing");
    const auto& t = it->second;
    if (!t.defined() || t.sizes() != target.sizes())
      throw Error("optimizer state: tensor " + name + " has shape " + shape_text(t) + ", expected " +
                  shape_text(target));
    if (t.scalar_type() != target.scalar_type())
      throw Error("optimizer state: tensor " + name + " is " + std::string(c10::toString(t.scalar_type())) +
                  ", expected " + c10::toString(target.scalar_type()));
  }
  for (const auto& [name, t] : tensors)
    if (!names.count(name))
      throw Error("optimizer state: unexpected tensor " + name + " (not part of this model's optimizer)");
  JsonObjectReader r(meta, "", "optimizer state");
  const long long step = r.get_int("step");
  if (step < 0) r.fail("step", "must be >= 0");
  std::map<std::string, double> scales;
  if (r.has("group_scales")) {
    const auto& s = r.get("group_scales");
    if (!s.is_object()) r.fail("group_scales", "expected an object of group name -> scale");
    for (const auto& [name, v] : s.items()) {
      bool known = false;
      for (const auto& g : groups_) known |= g.name == name;
      if (!known) r.fail("group_scales." + name, "no such parameter group in this model");
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
        r.fail("group_scales." + name, "expected a finite number >= 0");
      scales[name] = v.get<double>();
    }
  }
  r.get("config");  // recorded for the trainer; not applied here
  r.reject_unknown_keys();

  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : expected) target.copy_(tensors.at(name));
  for (auto& g : groups_)
    if (scales.count(g.name)) g.scale = scales[g.name];
  steps_ = step;
}

}  // namespace slm::train
