// The training micro-batch replayed from a CUDA graph (train/graph_step.h) does what the eager step does: the same
// main loss, gradients and MoE balance loads for every batch, with the warm-up's work put back, a second capture
// once a batch holds more documents than the first graph was made for, and `slm train --cuda-graph` follows the
// eager run. The CUDA cases are skipped without a GPU; on the CPU the option is refused with its reason.
#include <ATen/autocast_mode.h>
#include <sys/stat.h>

#include <sstream>

#include "model/model_test_util.h"
#include "slm/model/layers/moe.h"
#include "slm/recipe/recipe.h"
#include "slm/train/graph_step.h"
#include "slm/util/files.h"
#include "train/train_test_util.h"

namespace slm::test {
namespace {

// Document ids [rows, len] that start a document every `every` tokens (shifted by the row), or one document per row
// (every 0); int32 like data::Batch's.
torch::Tensor document_ids(int64_t rows, int64_t len, int64_t every) {
  auto ids = torch::zeros({rows, len}, torch::kInt);
  if (every > 0)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < len; ++i) ids[r][i] = static_cast<int32_t>((i + 3 * r) / every);
  return ids;
}

struct StepResult {
  double loss = 0;
  std::vector<torch::Tensor> grads;  // per parameter, undefined where the backward does not reach
  std::vector<torch::Tensor> loads;  // per MoE layer: what the step added to its balance load
};

std::vector<torch::Tensor> pending_loads(model::HybridLM& m) {
  std::vector<torch::Tensor> out;
  for (auto* moe : m.moe_modules()) out.push_back(moe->pending_load().cpu().clone());
  return out;
}

StepResult collect(model::HybridLM& m, double loss, const std::vector<torch::Tensor>& before) {
  StepResult r;
  r.loss = loss;
  for (const auto& p : m.parameters()) r.grads.push_back(p.grad().defined() ? p.grad().cpu().clone() : p.grad());
  auto after = pending_loads(m);
  for (size_t i = 0; i < after.size(); ++i) r.loads.push_back(after[i] - before[i]);
  return r;
}

// The trainer's eager micro-batch (train/trainer.cpp), written out here as the reference.
StepResult eager_step(model::HybridLM& m, const torch::Tensor& tokens, const torch::Tensor& ids, int64_t accum) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
  const auto before = pending_loads(m);
  const int64_t t = tokens.size(1) - 1;
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  auto out = m.loss(tokens.narrow(1, 0, t).cuda(), tokens.narrow(1, 1, t).cuda(), ids);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  (out.total / static_cast<double>(accum)).backward();
  return collect(m, out.main.item<double>(), before);
}

StepResult graph_step(train::GraphStep& g, model::HybridLM& m, const torch::Tensor& tokens, const torch::Tensor& ids) {
  g.zero_grad();
  const auto before = pending_loads(m);
  const double loss = g.run(tokens, ids).item<double>();
  return collect(m, loss, before);
}

void expect_same_step(const StepResult& graph, const StepResult& eager, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_NEAR(graph.loss, eager.loss, 2e-3 * std::abs(eager.loss));
  ASSERT_EQ(graph.grads.size(), eager.grads.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < eager.grads.size(); ++i) {
    ASSERT_EQ(graph.grads[i].defined(), eager.grads[i].defined()) << "parameter " << i;
    if (!eager.grads[i].defined()) continue;
    const auto e = eager.grads[i].to(torch::kDouble), d = graph.grads[i].to(torch::kDouble) - e;
    diff += d.pow(2).sum().item<double>();
    norm += e.pow(2).sum().item<double>();
    // A gradient the graph missed or doubled is off by its whole size; BF16 noise by a few percent.
    EXPECT_LE(d.norm().item<double>(), 0.1 * e.norm().item<double>() + 1e-6) << "parameter " << i;
  }
  EXPECT_LE(std::sqrt(diff), 2e-2 * std::sqrt(norm));
  ASSERT_EQ(graph.loads.size(), eager.loads.size());
  for (size_t i = 0; i < eager.loads.size(); ++i) {
    // Every token's k assignments counted once; routing equal up to a rare BF16 tie.
    EXPECT_EQ(graph.loads[i].sum().item<int64_t>(), eager.loads[i].sum().item<int64_t>()) << "MoE layer " << i;
    EXPECT_LE((graph.loads[i] - eager.loads[i]).abs().sum().item<int64_t>(), eager.loads[i].sum().item<int64_t>() / 50)
        << "MoE layer " << i;
  }
}

}  // namespace

TEST(GraphStep, NeedsACudaModel) {
  model::HybridLM m(parse(base_recipe()));
  EXPECT_FALSE(train::graph_step_blocker(m, false, false).empty());
  EXPECT_THROW(train::GraphStep(m, 2, 8, 1), Error);
}

TEST(GraphStep, TrainerRefusesTheOptionWithItsReason) {
  const std::string dir = fresh_dir("graph-cpu");
  const std::string data = dir + "/shards";
  ::mkdir(data.c_str(), 0755);
  write_counting_shards(data, "count", 48, 16, 3);
  auto c = micro_config(write_recipe(dir, micro_hybrid_json()), data, dir + "/run");
  c.cuda_graph = true;
  std::ostringstream log;
  train::Trainer t(c, log);
  try {
    t.run();
    ADD_FAILURE() << "--cuda-graph on the CPU must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graph"), std::string::npos) << e.what();
  }
}

// tiny-hybrid (every letter, SISO Mamba-3, MoE with a shared expert, MTP) and tiny-full without DSA (mHC, Engram,
// MLA, MIMO Mamba-3, an MLA MTP module).
TEST(GraphStepCuda, ReplaysTheEagerStepAndCapturesAgainForMoreDocuments) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto full = nlohmann::json::parse(read_file(source_path("recipes/tiny-full.json")));
  full["attention"]["dsa_enabled"] = false;
  for (const auto& j : {nlohmann::json::parse(read_file(source_path("recipes/tiny-hybrid.json"))), full}) {
    const Recipe r = parse(j);
    SCOPED_TRACE(r.name);
    model::HybridLM m(r, torch::TensorOptions().device(torch::kCUDA));
    randomize(m, 5);
    m.train();
    const int64_t rows = 4, t = 64, accum = 2;
    train::GraphStep g(m, rows, t, accum);
    // One document per row (4: capacity 8), then a document every 16 tokens (19 documents: a second capture with
    // room for 32), then every 20 (16: replayed without a capture).
    const std::vector<std::pair<int64_t, int64_t>> batches = {{0, 1}, {16, 2}, {20, 2}};
    for (size_t i = 0; i < batches.size(); ++i) {
      const auto [every, captures] = batches[i];
      const auto tokens = random_tokens(rows, t + 1, r.vocab_size, 40 + i);
      const auto ids = document_ids(rows, t + 1, every);
      const auto eager = eager_step(m, tokens, ids, accum);
      const auto graphed = graph_step(g, m, tokens, ids);
      EXPECT_EQ(g.captures(), captures) << "batch " << i;
      expect_same_step(graphed, eager, "batch " + std::to_string(i));
      // Replayed again: the same loss from the reloaded buffers, and the warm-up's gradients and loads did not stay.
      const auto again = graph_step(g, m, tokens, ids);
      EXPECT_EQ(again.loss, graphed.loss) << "batch " << i;
      expect_same_step(again, eager, "batch " + std::to_string(i) + " replayed");
    }
    EXPECT_EQ(g.document_capacity(), 32);
  }
}

// `slm train --cuda-graph` against the eager run: the same losses and gradient norms step by step (BF16 noise
// apart), with gradient accumulation.
TEST(GraphStepCuda, TrainingRunFollowsTheEagerRun) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fresh_dir("graph-run");
  const std::string data = dir + "/shards";
  ::mkdir(data.c_str(), 0755);
  write_counting_shards(data, "count", 48, 64, 11);
  const std::string recipe = write_recipe(dir, micro_hybrid_json());
  std::map<bool, std::vector<nlohmann::json>> runs;
  for (bool graph : {false, true}) {
    auto c = micro_config(recipe, data, dir + (graph ? "/graph" : "/eager"));
    c.device = "cuda";
    c.steps = 8;
    c.accum = 2;
    c.cuda_graph = graph;
    std::ostringstream log;
    train::Trainer(c, log).run();
    if (graph) {
      EXPECT_NE(log.str().find("CUDA graph"), std::string::npos) << log.str();
    }
    for (const auto& j : read_metrics(c.out))
      if (j.contains("loss")) runs[graph].push_back(j);
  }
  ASSERT_EQ(runs[false].size(), 8u);
  ASSERT_EQ(runs[true].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const auto &e = runs[false][i], &g = runs[true][i];
    EXPECT_NEAR(g["loss"].get<double>(), e["loss"].get<double>(), 1e-2 * e["loss"].get<double>()) << "step " << i + 1;
    EXPECT_NEAR(g["grad_norm"].get<double>(), e["grad_norm"].get<double>(), 5e-2 * e["grad_norm"].get<double>())
        << "step " << i + 1;
  }
}

}  // namespace slm::test
