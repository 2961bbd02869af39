// The optimizer against independent references: Newton-Schulz against the float64 SVD (its singular values in
// the documented band, the scalar polynomial map applied to the singular values, the polar factor U V^T), one
// Muon step against a naive float64 loop implementation, AdamW against torch::optim::AdamW, the parameter
// groups on every shipped recipe, checkpoint state round trips and strict loading, and sharded Muon.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "model/model_test_util.h"
#include "recipe/shipped_recipes.h"
#include "slm/model/layer_registry.h"
#include "slm/train/muon.h"
#include "slm/train/optimizer.h"
#include "slm/train/schedule.h"
#include "slm/util/format.h"

using namespace slm;
using namespace slm::test;
using namespace slm::train;

namespace {

using Mat = std::vector<std::vector<double>>;

Mat to_mat(const torch::Tensor& t) {
  auto d = t.to(torch::kDouble).contiguous();
  Mat m(d.size(0), std::vector<double>(d.size(1)));
  for (int64_t i = 0; i < d.size(0); ++i)
    for (int64_t j = 0; j < d.size(1); ++j) m[i][j] = d[i][j].item<double>();
  return m;
}

torch::Tensor to_tensor(const Mat& m) {
  auto t = torch::empty({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())}, torch::kDouble);
  for (size_t i = 0; i < m.size(); ++i)
    for (size_t j = 0; j < m[0].size(); ++j) t[i][j] = m[i][j];
  return t;
}

Mat transpose(const Mat& a) {
  Mat t(a[0].size(), std::vector<double>(a.size()));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[0].size(); ++j) t[j][i] = a[i][j];
  return t;
}

Mat matmul(const Mat& a, const Mat& b) {
  Mat c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

// The coefficient tuples as the notes give them (blocks_optim_quant.md §6.1), and their normalisation.
struct Spec {
  std::vector<std::array<double, 3>> tuples;
  double scale, eps;
};
Spec spec(NsCoefficients c, int steps) {
  if (c == NsCoefficients::Quintic)
    return {std::vector<std::array<double, 3>>(steps, {3.4445, -4.7750, 2.0315}), 1.0, 1e-7};
  std::vector<std::array<double, 3>> pe = {{8.156554524902461, -22.48329292557795, 15.878769915207462},
                                           {4.042929935166739, -2.808917465908714, 0.5000178451051316},
                                           {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
                                           {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
                                           {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};
  pe.resize(steps);
  return {pe, 1.01, 1e-6};
}

// Newton-Schulz written out with loops in float64: wide orientation, X <- aX + bAX + cA^2X.
Mat reference_ns(Mat g, NsCoefficients c, int steps) {
  const bool tall = g.size() > g[0].size();
  if (tall) g = transpose(g);
  const Spec s = spec(c, steps);
  double fro = 0;
  for (const auto& row : g)
    for (double v : row) fro += v * v;
  fro = std::sqrt(fro);
  for (auto& row : g)
    for (double& v : row) v /= fro * s.scale + s.eps;
  for (const auto& [a, b, cc] : s.tuples) {
    Mat A = matmul(g, transpose(g));
    Mat AX = matmul(A, g), AAX = matmul(A, AX);
    for (size_t i = 0; i < g.size(); ++i)
      for (size_t j = 0; j < g[0].size(); ++j) g[i][j] = a * g[i][j] + b * AX[i][j] + cc * AAX[i][j];
  }
  return tall ? transpose(g) : g;
}

// The scalar map NS applies to each normalised singular value.
double scalar_map(double x, NsCoefficients c, int steps) {
  for (const auto& [a, b, cc] : spec(c, steps).tuples) x = a * x + b * x * x * x + cc * x * x * x * x * x;
  return x;
}

torch::Tensor gaussian(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn(shape, gen, torch::kFloat);
}

// A matrix with chosen singular values (log-spaced from lo to 1, times 3) and random singular vectors.
torch::Tensor with_spectrum(int64_t m, int64_t n, double lo, uint64_t seed) {
  const int64_t k = std::min(m, n);
  auto u = std::get<0>(torch::linalg_qr(gaussian({m, k}, seed).to(torch::kDouble)));
  auto v = std::get<0>(torch::linalg_qr(gaussian({n, k}, seed + 1).to(torch::kDouble)));
  auto s = 3.0 * torch::logspace(std::log10(lo), 0.0, k, 10.0, torch::kDouble);
  return (u * s).matmul(v.mT()).to(torch::kFloat);
}

double max_abs(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}
double spectral(const torch::Tensor& t) {
  return torch::linalg_svdvals(t).max().item<double>();
}

Recipe micro() {
  return parse(micro_ae_json());
}

// Every parameter gets a fresh seeded gradient.
void set_grads(model::HybridLM& m, uint64_t seed) {
  torch::manual_seed(seed);
  for (auto& p : m.named_parameters()) p.value().mutable_grad() = torch::randn_like(p.value());
}

void copy_weights(model::HybridLM& from, model::HybridLM& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(src[p.key()]);
}

std::map<std::string, torch::Tensor> clone_state(const Optimizer& o) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : o.state_tensors()) out[name] = t.clone();
  return out;
}

}  // namespace

// The documented bands (muon.h): singular values s/||G||_F >= 1e-3 (Polar Express) or >= 2e-3 (quintic)
// land in [0.853, 1.141] / [0.68, 1.21] under the exact map; the tests allow bf16 rounding on top:
// Polar Express [0.8, 1.2], quintic [0.6, 1.3] (inside the classic "U(0.5, 1.5)").
TEST(NewtonSchulz, SingularValuesWithinTheDocumentedBand) {
  single_threaded();
  const std::vector<torch::Tensor> inputs = {gaussian({64, 256}, 1), gaussian({256, 64}, 2), gaussian({3, 32, 96}, 3),
                                             with_spectrum(96, 96, 5e-3, 4), with_spectrum(48, 80, 5e-3, 6)};
  for (auto c : {NsCoefficients::PolarExpress, NsCoefficients::Quintic}) {
    const double lo = c == NsCoefficients::PolarExpress ? 0.8 : 0.6, hi = c == NsCoefficients::PolarExpress ? 1.2 : 1.3;
    for (const auto& g : inputs) {
      auto o = newton_schulz(g, 5, c);
      ASSERT_EQ(o.sizes(), g.sizes());
      ASSERT_EQ(o.scalar_type(), torch::kFloat);
      auto s = torch::linalg_svdvals(o.to(torch::kDouble));
      EXPECT_GE(s.min().item<double>(), lo) << ns_coefficients_name(c) << " " << shape_text(g);
      EXPECT_LE(s.max().item<double>(), hi) << ns_coefficients_name(c) << " " << shape_text(g);
    }
  }
}

// NS(G) = U f(S / (scale ||G||_F + eps)) V^T where f is the composed polynomial: computed from the float64
// SVD. In float64 the two agree to rounding; in bf16 to bf16 accuracy. Square Gaussian matrices have tiny
// singular values too, so this also covers the part of the spectrum outside the band.
TEST(NewtonSchulz, AppliesTheScalarMapToEverySingularValue) {
  single_threaded();
  for (auto c : {NsCoefficients::PolarExpress, NsCoefficients::Quintic}) {
    for (int steps : {1, 3, 5}) {
      for (const auto& g : {gaussian({40, 40}, 10), gaussian({24, 56}, 11), gaussian({56, 24}, 12)}) {
        auto [u, s, vh] = torch::linalg_svd(g.to(torch::kDouble), false);
        const Spec sp = spec(c, steps);
        const double denom = sp.scale * g.to(torch::kDouble).norm().item<double>() + sp.eps;
        auto f = s.clone();
        for (int64_t i = 0; i < s.size(0); ++i) f[i] = scalar_map(s[i].item<double>() / denom, c, steps);
        auto expected = (u * f).matmul(vh);
        const auto where =
            std::string(ns_coefficients_name(c)) + " steps " + std::to_string(steps) + " " + shape_text(g);
        EXPECT_LT(max_abs(newton_schulz(g.to(torch::kDouble), steps, c, torch::kDouble) - expected), 1e-10) << where;
        auto bf16 = newton_schulz(g, steps, c, torch::kBFloat16).to(torch::kDouble);
        EXPECT_LT((bf16 - expected).norm().item<double>() / expected.norm().item<double>(), 0.03) << where;
      }
    }
  }
}

// Against the polar factor U V^T itself: the spectral-norm distance is max |f(s) - 1|, so Polar Express with
// 5 bf16 steps is within 0.2 on well-spread spectra (band 0.853..1.141 plus rounding), the quintic within 0.35.
TEST(NewtonSchulz, ApproximatesThePolarFactor) {
  single_threaded();
  for (const auto& g : {gaussian({64, 160}, 20), gaussian({160, 64}, 21), with_spectrum(64, 64, 1e-2, 22)}) {
    auto [u, s, vh] = torch::linalg_svd(g.to(torch::kDouble), false);
    auto polar = u.matmul(vh);
    auto pe = newton_schulz(g, 5, NsCoefficients::PolarExpress).to(torch::kDouble);
    auto q = newton_schulz(g, 5, NsCoefficients::Quintic).to(torch::kDouble);
    EXPECT_LT(spectral(pe - polar), 0.2) << shape_text(g);
    EXPECT_LT(spectral(q - polar), 0.35) << shape_text(g);
    // And clearly better than doing nothing (the normalised input).
    auto raw = g.to(torch::kDouble) / g.to(torch::kDouble).norm();
    EXPECT_GT(spectral(raw - polar), 0.5) << shape_text(g);
  }
}

TEST(NewtonSchulz, MatchesTheLoopReferenceAndIsDeterministic) {
  single_threaded();
  auto g = gaussian({6, 9}, 30);
  for (auto c : {NsCoefficients::PolarExpress, NsCoefficients::Quintic}) {
    auto ref = to_tensor(reference_ns(to_mat(g), c, 5));
    EXPECT_LT(max_abs(newton_schulz(g.to(torch::kDouble), 5, c, torch::kDouble) - ref), 1e-12);
    EXPECT_TRUE(torch::equal(newton_schulz(g, 5, c), newton_schulz(g, 5, c)));
  }
  EXPECT_THROW(newton_schulz(g, 6, NsCoefficients::PolarExpress), Error);  // 5 tuples only
  EXPECT_THROW(newton_schulz(torch::ones({4}), 5, NsCoefficients::Quintic), Error);
}

// Two Muon steps on the micro model (float64, NS in float64) against the update written out with loops:
// Nesterov EMA momentum with the warmed-up mu, NS, the shape scale, decoupled weight decay.
TEST(Muon, TwoStepsMatchTheFloat64LoopReference) {
  single_threaded();
  // The stack sizes: everything of one shape in one NS call; one 8x8 matrix per call; runs split across calls.
  for (const auto& [variant, stack] : std::vector<std::pair<std::string, int64_t>>{
           {"jordan", int64_t{1} << 26}, {"moonlight", int64_t{1} << 26}, {"jordan", 50}, {"jordan", 130}}) {
    model::HybridLM m(micro(), torch::TensorOptions().dtype(torch::kDouble));
    randomize(m, 5);
    OptimizerConfig cfg;
    cfg.ns_dtype = "float64";
    cfg.muon_shape_scale = variant;
    cfg.muon_stack_elements = stack;
    cfg.muon_momentum_start = 0.8;
    cfg.muon_momentum = 0.9;
    cfg.momentum_warmup_steps = 4;
    cfg.weight_decay = 0.1;
    Optimizer opt(m, cfg);

    // The reference state: per Muon tensor, per matrix.
    std::map<std::string, std::vector<Mat>> w, buf;
    std::vector<std::string> names;
    for (const auto& g : opt.groups())
      if (g.algorithm == Algorithm::Muon)
        for (size_t pi : g.params) names.push_back(opt.param_name(pi));
    ASSERT_FALSE(names.empty());
    auto params = m.named_parameters();
    for (const auto& n : names) {
      auto t = params[n].reshape({-1, params[n].size(-2), params[n].size(-1)});
      for (int64_t k = 0; k < t.size(0); ++k) {
        w[n].push_back(to_mat(t[k]));
        buf[n].push_back(Mat(t.size(1), std::vector<double>(t.size(2), 0.0)));
      }
    }
    const double mus[2] = {0.8, 0.8 + 0.1 / 4};  // momentum_warmup at steps 0 and 1
    const double mults[2] = {1.0, 0.5};
    for (int step = 0; step < 2; ++step) {
      set_grads(m, 100 + step);
      EXPECT_DOUBLE_EQ(opt.momentum(), mus[step]);
      const double mu = mus[step], lr = 0.02 * mults[step];
      for (const auto& n : names) {
        auto gt = params[n].grad().reshape({-1, params[n].size(-2), params[n].size(-1)});
        for (int64_t k = 0; k < gt.size(0); ++k) {
          Mat g = to_mat(gt[k]), u = g;
          Mat& b = buf[n][k];
          for (size_t i = 0; i < g.size(); ++i)
            for (size_t j = 0; j < g[0].size(); ++j) {
              b[i][j] = mu * b[i][j] + (1 - mu) * g[i][j];
              u[i][j] = (1 - mu) * g[i][j] + mu * b[i][j];
            }
          Mat o = reference_ns(u, NsCoefficients::PolarExpress, 5);
          const double r = static_cast<double>(g.size()), c = static_cast<double>(g[0].size());
          const double scale = variant == "jordan" ? std::sqrt(std::max(1.0, r / c)) : 0.2 * std::sqrt(std::max(r, c));
          for (size_t i = 0; i < g.size(); ++i)
            for (size_t j = 0; j < g[0].size(); ++j)
              w[n][k][i][j] = w[n][k][i][j] * (1 - lr * 0.1) - lr * scale * o[i][j];
        }
      }
      opt.step(mults[step]);
    }
    for (const auto& n : names) {
      auto t = params[n].reshape({-1, params[n].size(-2), params[n].size(-1)});
      for (int64_t k = 0; k < t.size(0); ++k)
        EXPECT_LT(max_abs(t[k] - to_tensor(w[n][k])), 1e-12) << variant << " stack " << stack << " " << n << " " << k;
    }
  }
}

// The bf16 NS the trainer uses moves each matrix by the same update to bf16 accuracy.
TEST(Muon, Bf16StepCloseToFloat64Step) {
  single_threaded();
  model::HybridLM a(micro(), torch::TensorOptions().dtype(torch::kFloat)),
      b(micro(), torch::TensorOptions().dtype(torch::kFloat));
  randomize(a, 6);
  copy_weights(a, b);
  OptimizerConfig exact, bf16;
  exact.ns_dtype = "float64";
  bf16.ns_dtype = "bfloat16";
  Optimizer oa(a, bf16), ob(b, exact);
  auto before = a.named_parameters()["layers.0.attn.wq.weight"].clone();
  set_grads(a, 7);
  set_grads(b, 7);
  oa.step(1.0);
  ob.step(1.0);
  auto da = a.named_parameters()["layers.0.attn.wq.weight"] - before;
  auto db = b.named_parameters()["layers.0.attn.wq.weight"] - before;
  EXPECT_GT(db.norm().item<double>(), 0);
  EXPECT_LT((da - db).norm().item<double>() / db.norm().item<double>(), 0.03);
}

// "auto" (the default) multiplies in BF16 only where the device does so natively: on a CPU that means AMX-BF16
// tiles, read here from the kernel's /proc/cpuinfo flags rather than from libtorch's cpuinfo the code asks. Without
// them the default step must be the float32 step, bit for bit (emulated BF16 GEMMs were 41x slower than FP32 here).
TEST(Muon, AutoComputeTypeIsFloat32OnCpusWithoutNativeBf16) {
  single_threaded();
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool amx_bf16 = false;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) amx_bf16 = amx_bf16 || (line + " ").find(" amx_bf16 ") != std::string::npos;
  model::HybridLM a(micro(), torch::TensorOptions().dtype(torch::kFloat)),
      b(micro(), torch::TensorOptions().dtype(torch::kFloat));
  randomize(a, 8);
  copy_weights(a, b);
  OptimizerConfig fp32;
  fp32.ns_dtype = "float32";
  Optimizer oa(a, OptimizerConfig{}), ob(b, fp32);
  EXPECT_EQ(OptimizerConfig{}.ns_dtype, "auto");
  EXPECT_EQ(oa.ns_compute_type(), amx_bf16 ? torch::kBFloat16 : torch::kFloat);
  if (amx_bf16) return;  // the bitwise comparison below is for CPUs without native BF16
  set_grads(a, 9);
  set_grads(b, 9);
  oa.step(1.0);
  ob.step(1.0);
  auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
}

TEST(AdamW, MatchesTorchOptimAdamW) {
  single_threaded();
  model::HybridLM m(micro(), torch::TensorOptions().dtype(torch::kFloat));
  randomize(m, 8);
  OptimizerConfig cfg;
  cfg.embed_weight_decay = 0.05;  // non-zero decay on two groups, the default zero on the others
  cfg.head_weight_decay = 0.02;
  Optimizer opt(m, cfg);
  // The LRs the groups must have: width-scaled embedding and head (d_model 8), the others as configured.
  const double width = std::sqrt(768.0 / 8.0);
  std::map<std::string, double> lr = {{"embedding", 0.3 * width}, {"head", 0.008 * width},
                                      {"router", 0.005},          {"norm", 0.005},
                                      {"vector", 0.005},          {"scalar", 0.005}};
  auto params = m.named_parameters();
  std::vector<torch::optim::OptimizerParamGroup> torch_groups;
  std::map<std::string, torch::Tensor> shadow;
  int adam_groups = 0;
  for (const auto& g : opt.groups()) {
    if (g.algorithm != Algorithm::AdamW) continue;
    ++adam_groups;
    ASSERT_TRUE(lr.count(g.name)) << g.name;
    EXPECT_NEAR(g.lr, lr[g.name], 1e-15) << g.name;
    std::vector<torch::Tensor> ts;
    for (size_t pi : g.params) {
      auto t = params[opt.param_name(pi)].detach().clone().set_requires_grad(true);
      shadow[opt.param_name(pi)] = t;
      ts.push_back(t);
    }
    auto o = std::make_unique<torch::optim::AdamWOptions>(lr[g.name]);
    o->betas({0.8, g.name == "embedding" ? 0.995 : 0.95}).eps(1e-10).weight_decay(g.weight_decay);
    torch_groups.emplace_back(ts, std::move(o));
  }
  EXPECT_EQ(adam_groups, 5);  // embedding, head, router, norm, scalar (the micro model has no vectors)
  torch::optim::AdamW reference(torch_groups, torch::optim::AdamWOptions(1.0));
  for (int step = 0; step < 6; ++step) {
    set_grads(m, 200 + step);
    for (auto& [name, t] : shadow) t.mutable_grad() = params[name].grad().clone();
    opt.step(1.0);
    reference.step();
  }
  for (const auto& [name, t] : shadow) {
    const double scale = std::max(1.0, max_abs(t));
    EXPECT_LT(max_abs(params[name] - t) / scale, 1e-6) << name;
    EXPECT_FALSE(torch::equal(params[name], params[name].clone().zero_())) << name;
  }
}

// Every parameter of every shipped recipe lands in exactly one group, by the rule in optimizer.h, and the
// optimizer's own groups of the model built on the meta device list every model parameter once.
TEST(OptimizerGroups, CoverEveryParameterOfEveryShippedRecipeOnce) {
  auto files = shipped_recipes();
  ASSERT_GE(files.size(), 16u);
  int built = 0;
  for (const auto& f : files) {
    Recipe r = load_recipe(f);
    Accounting acc = account(r, make_plan(r));
    std::map<std::string, long long> numel_by_group;
    std::set<std::string> names;
    for (const auto& s : acc.params) {
      EXPECT_TRUE(names.insert(s.name).second) << f << ": " << s.name << " listed twice";
      const std::string g = param_group(s);
      numel_by_group[g] += s.numel();
      const bool muon = group_algorithm(g) == Algorithm::Muon;
      if (s.kind == ParamKind::Linear || s.kind == ParamKind::Expert || s.kind == ParamKind::Mixing) {
        EXPECT_TRUE(muon) << f << ": " << s.name;
        EXPECT_EQ(s.shape.size(), s.kind == ParamKind::Expert ? 3u : 2u) << f << ": " << s.name;
      } else {
        EXPECT_FALSE(muon) << f << ": " << s.name;
      }
      if (s.kind == ParamKind::Table) {
        EXPECT_EQ(g, "table") << s.name;
      }
      if (s.kind == ParamKind::Embedding) {
        EXPECT_EQ(g, "embedding") << s.name;
      }
      if (s.kind == ParamKind::Head) {
        EXPECT_EQ(g, "head") << s.name;
      }
      EXPECT_NE(std::find(group_names().begin(), group_names().end(), g), group_names().end()) << g;
    }
    long long sum = 0;
    for (const auto& [g, n] : numel_by_group) sum += n;
    EXPECT_EQ(sum, acc.stored) << f;

    ++built;
    model::HybridLM m(r, torch::TensorOptions().device(torch::kMeta));
    Optimizer opt(m, OptimizerConfig{});
    std::map<std::string, int> seen;
    long long muon_matrices = 0;
    for (const auto& g : opt.groups())
      for (size_t pi : g.params) ++seen[opt.param_name(pi)];
    for (const auto& p : m.named_parameters()) EXPECT_EQ(seen[p.key()], 1) << f << ": " << p.key();
    EXPECT_EQ(seen.size(), m.named_parameters().size()) << f;
    for (const auto& s : acc.params)
      if (param_group(s) == "matrix") muon_matrices += s.shape.size() == 3 ? s.shape[0] : 1;
    EXPECT_EQ(static_cast<long long>(opt.muon_matrices().size()), muon_matrices) << f;
    const std::string table = opt.describe(true);
    for (const auto& g : opt.groups()) EXPECT_NE(table.find(g.name), std::string::npos) << table;
    for (const auto& p : m.named_parameters()) EXPECT_NE(table.find(p.key()), std::string::npos) << p.key();
    EXPECT_NE(table.find(human_count(acc.stored)), std::string::npos) << table;
  }
  EXPECT_EQ(built, static_cast<int>(files.size()));
}

TEST(OptimizerState, RoundTripGivesBitwiseIdenticalNextSteps) {
  single_threaded();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  model::HybridLM a(micro(), f32), b(micro(), f32);
  randomize(a, 9);
  OptimizerConfig cfg;
  cfg.momentum_warmup_steps = 3;
  Optimizer oa(a, cfg);
  LrSchedule sched;
  sched.warmup_steps = 2;
  for (int s = 0; s < 3; ++s) {
    set_grads(a, 300 + s);
    oa.step(sched.multiplier(s, 6));
  }
  // The checkpoint: weights, state tensors, JSON (through text, as a file would carry it).
  copy_weights(a, b);
  const auto saved = clone_state(oa);
  const auto meta = nlohmann::json::parse(oa.state_json().dump());
  Optimizer ob(b, cfg);
  ob.load_state(saved, meta);
  EXPECT_EQ(ob.steps(), 3);
  EXPECT_DOUBLE_EQ(ob.momentum(), oa.momentum());
  for (int s = 3; s < 6; ++s) {
    set_grads(a, 300 + s);
    set_grads(b, 300 + s);
    oa.step(sched.multiplier(s, 6));
    ob.step(sched.multiplier(s, 6));
  }
  auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  auto sb = clone_state(ob);
  for (const auto& [name, t] : oa.state_tensors()) EXPECT_TRUE(torch::equal(t, sb.at(name))) << name;
}

TEST(OptimizerState, NamesTheBadTensorAndChangesNothing) {
  single_threaded();
  model::HybridLM m(micro(), torch::TensorOptions().dtype(torch::kFloat));
  randomize(m, 10);
  Optimizer opt(m, OptimizerConfig{});
  set_grads(m, 11);
  opt.step(1.0);
  const auto good = clone_state(opt);
  const auto meta = opt.state_json();
  ASSERT_TRUE(good.count("muon.momentum/layers.0.attn.wq.weight"));
  ASSERT_TRUE(good.count("adamw.exp_avg_sq/embed.weight"));
  ASSERT_TRUE(good.count("adamw.step/final_norm.weight"));

  auto expect_refused = [&](const std::map<std::string, torch::Tensor>& t, const nlohmann::json& j,
                            const std::string& fragment) {
    // Fresh, different state in a second optimizer: a refused load must leave it as it was.
    model::HybridLM m2(micro(), torch::TensorOptions().dtype(torch::kFloat));
    Optimizer o2(m2, OptimizerConfig{});
    const auto before = clone_state(o2);
    try {
      o2.load_state(t, j);
      ADD_FAILURE() << "expected an error mentioning " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(o2.steps(), 0);
    for (const auto& [name, x] : o2.state_tensors()) EXPECT_TRUE(torch::equal(x, before.at(name))) << name;
  };
  auto missing = good;
  missing.erase("adamw.exp_avg/lm_head.weight");
  expect_refused(missing, meta, "adamw.exp_avg/lm_head.weight is missing");
  auto shape = good;
  shape["muon.momentum/layers.1.moe.experts.w13"] = torch::zeros({3, 8, 8});
  expect_refused(shape, meta, "muon.momentum/layers.1.moe.experts.w13 has shape [3, 8, 8]");
  auto dtype = good;
  dtype["adamw.exp_avg/embed.weight"] = good.at("adamw.exp_avg/embed.weight").to(torch::kDouble);
  expect_refused(dtype, meta, "adamw.exp_avg/embed.weight is Double");
  auto extra = good;
  extra["adamw.exp_avg/layers.99.norm.weight"] = torch::zeros({8});
  expect_refused(extra, meta, "unexpected tensor adamw.exp_avg/layers.99.norm.weight");
  auto no_step = meta;
  no_step.erase("step");
  expect_refused(good, no_step, "step");
  // And a good state loads into it.
  model::HybridLM m3(micro(), torch::TensorOptions().dtype(torch::kFloat));
  Optimizer o3(m3, OptimizerConfig{});
  EXPECT_NO_THROW(o3.load_state(good, meta));
  EXPECT_EQ(o3.steps(), 1);
}

// Whole-matrix ownership: each rank updates only the Muon matrices it owns (and leaves the rest), every rank
// updates the AdamW parameters identically, and the owned pieces put together equal the unsharded step.
TEST(Muon, ShardedStepsAssembleToTheFullStep) {
  single_threaded();
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  OptimizerConfig cfg;
  cfg.ns_dtype = "float64";
  model::HybridLM full(micro(), f64);
  randomize(full, 12);
  model::HybridLM start(micro(), f64);
  copy_weights(full, start);
  Optimizer ofull(full, cfg);
  set_grads(full, 13);
  ofull.step(1.0);

  const int world = 3;
  const auto owners = assign_muon_owners(ofull.muon_matrices(), world);
  std::vector<std::unique_ptr<model::HybridLM>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<model::HybridLM>(micro(), f64));
    copy_weights(start, *ranks.back());
    Optimizer o(*ranks.back(), cfg);
    set_grads(*ranks.back(), 13);
    o.step(1.0, MuonShard{r, world, {}});
  }
  auto pf = full.named_parameters(), p0 = start.named_parameters();
  const auto& mats = ofull.muon_matrices();
  std::set<std::string> muon_names;
  for (size_t i = 0; i < mats.size(); ++i) {
    const std::string& name = ofull.param_name(mats[i].param);
    muon_names.insert(name);
    for (int r = 0; r < world; ++r) {
      auto slice = [&](const torch::Tensor& t) { return t.reshape({-1, mats[i].rows, mats[i].cols})[mats[i].index]; };
      auto mine = slice(ranks[r]->named_parameters()[name]);
      if (owners[i] == r)
        EXPECT_LT(max_abs(mine - slice(pf[name])), 1e-13) << name << " " << mats[i].index;
      else
        EXPECT_TRUE(torch::equal(mine, slice(p0[name]))) << "rank " << r << " changed " << name << " " << mats[i].index;
    }
  }
  for (const auto& p : full.named_parameters()) {
    if (!muon_names.count(p.key())) {
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(torch::equal(ranks[r]->named_parameters()[p.key()], p.value())) << p.key();
    }
  }
}

TEST(Muon, OwnerAssignmentIsBalancedAndDeterministic) {
  std::vector<MuonMatrix> mats;
  for (int i = 0; i < 40; ++i) mats.push_back({static_cast<size_t>(i), 0, 16 + (i * 37) % 96, 64});
  for (int world : {1, 2, 3, 8}) {
    auto owners = assign_muon_owners(mats, world);
    EXPECT_EQ(owners, assign_muon_owners(mats, world));
    std::vector<double> load(world, 0.0);
    double biggest = 0;
    for (size_t i = 0; i < mats.size(); ++i) {
      ASSERT_GE(owners[i], 0);
      ASSERT_LT(owners[i], world);
      load[owners[i]] += mats[i].ns_flops();
      biggest = std::max(biggest, mats[i].ns_flops());
    }
    auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, biggest) << world;
  }
  EXPECT_THROW(assign_muon_owners(mats, 0), Error);
}

TEST(Optimizer, FrozenGroupsAndMissingGradsAreSkipped) {
  single_threaded();
  model::HybridLM m(micro(), torch::TensorOptions().dtype(torch::kFloat));
  randomize(m, 14);
  Optimizer opt(m, OptimizerConfig{});
  opt.set_group_scale("matrix", 0.0);
  EXPECT_THROW(opt.set_group_scale("indexer", 1.0), Error);  // the micro model has no DSA
  set_grads(m, 15);
  auto params = m.named_parameters();
  params["final_norm.weight"].mutable_grad() = torch::Tensor();
  std::map<std::string, torch::Tensor> before;
  for (const auto& p : params) before[p.key()] = p.value().clone();
  opt.step(1.0);
  for (const auto& g : opt.groups())
    for (size_t pi : g.params) {
      const auto& n = opt.param_name(pi);
      const bool same = torch::equal(params[n], before[n]);
      if (g.name == "matrix" || n == "final_norm.weight")
        EXPECT_TRUE(same) << n;
      else
        EXPECT_FALSE(same) << n;
    }
  for (const auto& [name, t] : opt.state_tensors())  // a frozen group's momentum does not move either
    if (name.rfind("muon.", 0) == 0) {
      EXPECT_EQ(max_abs(t), 0.0) << name;
    }
}

// The optimizer trains: the micro model memorises one fixed batch within a few dozen steps.
TEST(Optimizer, DrivesTheLossDownOnAFixedBatch) {
  single_threaded();
  torch::manual_seed(16);
  model::HybridLM m(micro(), torch::TensorOptions().dtype(torch::kFloat));
  auto tokens = random_tokens(4, 17, 13, 17);
  auto input = tokens.narrow(1, 0, 16), target = tokens.narrow(1, 1, 16);
  Optimizer opt(m, OptimizerConfig{});
  LrSchedule sched;
  sched.warmup_steps = 5;
  const int steps = 80;
  double first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto loss = m.loss(input, target).main;
    if (s == 0) first = loss.item<double>();
    last = loss.item<double>();
    loss.backward();
    opt.step(sched.multiplier(s, steps));
    m.update_balancing_biases();
  }
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

TEST(OptimizerConfig, JsonRoundTripAndStrictErrors) {
  OptimizerConfig c;
  c.matrix_lr = 0.03;
  c.ns_coefficients = "quintic";
  c.ns_steps = 7;
  c.momentum_warmup_steps = 12;
  c.muon_stack_elements = 1000;
  auto d = OptimizerConfig::from_json(nlohmann::json::parse(c.to_json().dump()));
  EXPECT_EQ(d.to_json(), c.to_json());
  auto expect_error = [](const nlohmann::json& j, const std::string& fragment) {
    try {
      OptimizerConfig::from_json(j, "run.json");
      ADD_FAILURE() << "expected an error for " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error({{"matrix_lrr", 0.1}}, "matrix_lrr");
  expect_error({{"adam_beta2", 1.0}}, "adam_beta2");
  expect_error({{"ns_coefficients", "cubic"}}, "ns_coefficients");
  expect_error({{"ns_coefficients", "polar-express"}, {"ns_steps", 6}}, "ns_steps");
  expect_error({{"muon_shape_scale", "x"}}, "muon_shape_scale");
  expect_error({{"embed_lr", -1}}, "embed_lr");
  expect_error({{"muon_stack_elements", 0}}, "muon_stack_elements");
}

// The trainer's GPU path: the same steps on a CUDA model (FP32 master weights, NS in bf16 or fp32 there) move
// the weights as on the CPU. Skipped without a GPU (run by the CUDA build's ctest on the GPU machine).
TEST(OptimizerCuda, StepsMatchTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  single_threaded();
  for (const std::string ns_dtype : {"float32", "bfloat16"}) {
    model::HybridLM cpu(micro(), torch::TensorOptions().dtype(torch::kFloat));
    randomize(cpu, 40);
    model::HybridLM gpu(micro(), torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
    copy_weights(cpu, gpu);
    std::map<std::string, torch::Tensor> before;
    for (const auto& p : cpu.named_parameters()) before[p.key()] = p.value().clone();
    OptimizerConfig cfg;
    cfg.ns_dtype = ns_dtype;
    Optimizer oc(cpu, cfg), og(gpu, cfg);
    for (const auto& [name, t] : og.state_tensors())
      EXPECT_EQ(t.is_cuda(), name.rfind("adamw.step/", 0) != 0) << name;  // step counters stay on the host
    EXPECT_EQ(Optimizer(gpu, OptimizerConfig{}).ns_compute_type(), torch::kBFloat16);  // "auto" on tensor cores
    auto pg = gpu.named_parameters();
    for (int s = 0; s < 3; ++s) {
      set_grads(cpu, 41 + s);
      for (const auto& p : cpu.named_parameters()) pg[p.key()].mutable_grad() = p.value().grad().cuda();
      oc.step(1.0);
      og.step(1.0);
    }
    // Compare the total movement of each tensor: fp32 NS agrees to float rounding, bf16 NS to bf16 accuracy.
    const double tol = ns_dtype == "float32" ? 1e-4 : 0.05;
    for (const auto& p : cpu.named_parameters()) {
      auto moved = p.value() - before[p.key()];
      auto diff = pg[p.key()].cpu() - p.value();
      EXPECT_LE(diff.norm().item<double>(), tol * moved.norm().item<double>() + 1e-7) << ns_dtype << " " << p.key();
    }
  }
}
