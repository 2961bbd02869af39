// The one model definition on CUDA: a model built on the GPU with the CPU model's weights gives the same logits,
// cached decode matches its own forward there, and training (loss + backward) runs. Skipped without a GPU; run
// on the GPU machine by bench/gpu_check.sh's full ctest (README, "CUDA build").
#include "model_test_util.h"
#include "slm/engine/graph_decoder.h"
#include "slm/model/weights.h"

using namespace slm;
using namespace slm::test;

namespace {

double rel_diff(const torch::Tensor& a, const torch::Tensor& ref) {
  return max_abs_diff(a.cpu(), ref.cpu()) / ref.abs().max().item<double>();
}

// A CUDA model holding exactly the CPU model's weights (built on the device, not moved: caches and buffers are
// created where the model lives).
void copy_weights(model::HybridLM& dst, const model::HybridLM& src) {
  torch::NoGradGuard no_grad;
  auto from = model::named_state(src);
  for (auto& [name, t] : model::named_state(dst)) t.copy_(from.at(name));
}

}  // namespace

TEST(CudaModel, EveryLayerFamilyMatchesTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // tiny-full: mHC (learned mixes, then plain ones, whose decode runs the fused stream add + mean), Engram, MLA, DSA.
  for (const char* recipe : {"recipes/tiny-hybrid.json", "recipes/tiny-ae.json", "recipes/tiny-full.json"}) {
    Recipe r = load_recipe(source_path(recipe));
    model::HybridLM cpu(r);
    randomize(cpu, 7);
    model::HybridLM gpu(r, torch::TensorOptions().device(torch::kCUDA));
    copy_weights(gpu, cpu);
    cpu.eval();
    gpu.eval();
    auto tokens = random_tokens(2, 48, r.vocab_size, 3);
    auto ref = cpu.forward(tokens).logits;
    auto out = gpu.forward(tokens.cuda()).logits;
    EXPECT_TRUE(out.is_cuda());
    EXPECT_LE(rel_diff(out, ref), 1e-3) << recipe;

    // Prefill then token-by-token decode on the GPU reproduce the GPU's full forward.
    auto state = gpu.new_state(2, 48);
    auto pre = gpu.prefill(tokens.cuda().narrow(1, 0, 20), state);
    EXPECT_LE(rel_diff(pre, out.narrow(1, 0, 20)), 1e-3) << recipe;
    for (int64_t t = 20; t < 48; ++t) {
      auto step = gpu.decode(tokens.cuda().select(1, t), state);
      ASSERT_LE(rel_diff(step, out.select(1, t)), 1e-3) << recipe << " position " << t;
    }
  }
}

TEST(CudaModel, TrainingStepRunsAndMatchesTheCpuLoss) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Recipe r = load_recipe(source_path("recipes/tiny-hybrid.json"));
  model::HybridLM cpu(r);
  randomize(cpu, 9);
  model::HybridLM gpu(r, torch::TensorOptions().device(torch::kCUDA));
  copy_weights(gpu, cpu);
  auto tokens = random_tokens(2, 33, r.vocab_size, 4);
  auto in = tokens.narrow(1, 0, 32), target = tokens.narrow(1, 1, 32);
  auto l_cpu = cpu.loss(in, target).total;
  auto l_gpu = gpu.loss(in.cuda(), target.cuda()).total;
  EXPECT_NEAR(l_gpu.item<double>(), l_cpu.item<double>(), 1e-3 * std::abs(l_cpu.item<double>()));
  l_cpu.backward();
  l_gpu.backward();
  auto g_cpu = model::named_state(cpu);
  for (const auto& p : gpu.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    auto g = p.value().grad();
    EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << p.key();
    auto ref = g_cpu.at(p.key()).grad();
    double scale = std::max(ref.abs().max().item<double>(), 1e-6);
    EXPECT_LE(max_abs_diff(g.cpu(), ref) / scale, 5e-3) << p.key();
  }
}

// A decode step replayed from a CUDA graph is the eager step: the same kernels on the same buffers, at positions the
// capture never saw. Both run from the same prefill, fed the same tokens, FP32 and BF16.
TEST(CudaModel, GraphDecodeReplaysTheEagerStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* recipe : {"recipes/tiny-hybrid.json", "recipes/tiny-ae.json"}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      Recipe r = load_recipe(source_path(recipe));
      model::HybridLM gpu(r, torch::TensorOptions().device(torch::kCUDA).dtype(dtype));
      randomize(gpu, 11);
      gpu.eval();
      ASSERT_EQ(engine::graph_decode_blocker(gpu, gpu.new_state(1, 4)), "") << recipe;
      auto tokens = random_tokens(2, 60, r.vocab_size, 5).cuda();
      auto eager = gpu.new_state(2, 64), graphed = gpu.new_state(2, 64);
      gpu.prefill(tokens.narrow(1, 0, 12), eager);
      gpu.prefill(tokens.narrow(1, 0, 12), graphed);
      engine::GraphDecoder graph(gpu, graphed);
      EXPECT_EQ(graphed.length, 12);
      for (int64_t t = 12; t < 60; ++t) {
        auto a = gpu.decode(tokens.select(1, t), eager);
        auto b = graph.step(tokens.select(1, t));
        ASSERT_LE(rel_diff(b, a), 1e-6) << recipe << " " << dtype << " position " << t;
      }
      EXPECT_EQ(graphed.length, 60);
      auto with_history = gpu.new_state(1, 8, /*max_rollback=*/2);
      EXPECT_THROW({ engine::GraphDecoder g(gpu, with_history); }, Error);
      // Past the capacity the step refuses instead of writing outside the cache.
      for (int64_t t = 60; t < 64; ++t) graph.step(tokens.select(1, 0));
      EXPECT_THROW(graph.step(tokens.select(1, 0)), Error);
    }
  }
}

TEST(GraphDecoder, SaysWhyNotOnTheCpu) {
  Recipe r = load_recipe(source_path("recipes/tiny-ae.json"));
  model::HybridLM cpu(r);
  auto state = cpu.new_state(1, 8);
  EXPECT_NE(engine::graph_decode_blocker(cpu, state), "");
  EXPECT_THROW({ engine::GraphDecoder g(cpu, state); }, Error);
}
