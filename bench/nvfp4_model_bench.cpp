// Whole-model decode throughput on the CPU: dense FP32 weights against the same weights through `slm quantize`
// (NVFP4, loaded by model::load_weights, so every quantizable matrix runs slm::nvfp4::linear).
//   nvfp4_model_bench [recipe.json] [decode tokens] [threads,...]
//   (defaults: recipes/hybrid-250m.json, 32, "1,2")
// Random weights (N(0, 1/fan_in) for matrices, so no projection is the zero matrix a fresh model starts with), batch
// 1, a 16-token prompt prefilled, then greedy decode; a step's time is one HybridLM::decode call. Reported: the
// median step over the decode tokens after two warm-up steps, as tokens/s, and the NVFP4 / FP32 ratio.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "random_weights.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/weights.h"
#include "slm/quant/quantize_checkpoint.h"
#include "slm/recipe/recipe.h"
#include "slm/util/error.h"

namespace {

constexpr int64_t kPrompt = 16;
constexpr int kWarmup = 2;

int64_t state_bytes(const slm::model::HybridLM& m) {
  int64_t b = 0;
  for (const auto& [name, t] : slm::model::named_state(m)) b += t.numel() * static_cast<int64_t>(t.element_size());
  return b;
}

struct Run {
  double tokens_per_s = 0;
  torch::Tensor first_logits;  // of the first decode step, to check the two models agree
};

Run decode(slm::model::HybridLM& m, int64_t steps) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  auto prompt = torch::randint(m.recipe().vocab_size, {1, kPrompt}, torch::kLong);
  auto state = m.new_state(1, kPrompt + kWarmup + steps);
  auto logits = m.prefill(prompt, state).select(1, kPrompt - 1);
  Run r;
  std::vector<double> ms;
  for (int64_t i = 0; i < kWarmup + steps; ++i) {
    auto next = logits.argmax(-1);
    auto start = std::chrono::steady_clock::now();
    logits = m.decode(next, state);
    if (i >= kWarmup)
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (i == 0) r.first_logits = logits.clone();
  }
  std::sort(ms.begin(), ms.end());
  r.tokens_per_s = 1000.0 / ms[ms.size() / 2];
  return r;
}

std::vector<int> parse_threads(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) out.push_back(std::stoi(part));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : std::string(SLM_SOURCE_DIR) + "/recipes/hybrid-250m.json";
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 32;
  const std::vector<int> threads = parse_threads(argc > 3 ? argv[3] : "1,2");
  try {
    if (steps < 1) throw slm::Error("decode tokens must be at least 1");
    const slm::Recipe recipe = slm::load_recipe(path);
    const std::string stem = "/tmp/nvfp4_model_bench_" + std::to_string(getpid());
    slm::model::HybridLM dense(recipe);
    slm::bench::randomize(dense);
    dense.eval();
    slm::model::save_weights(dense, stem + "_fp32.safetensors");
    auto report = slm::nvfp4::quantize_checkpoint(stem + "_fp32.safetensors", stem + "_nvfp4.safetensors", recipe, {});
    slm::model::HybridLM quant(recipe);
    slm::model::load_weights(quant, stem + "_nvfp4.safetensors");
    quant.eval();
    ::unlink((stem + "_fp32.safetensors").c_str());
    ::unlink((stem + "_nvfp4.safetensors").c_str());

    std::printf("recipe %s: batch 1, prompt %lld, %lld decode tokens (median step after %d warm-up)\n",
                recipe.name.c_str(), static_cast<long long>(kPrompt), static_cast<long long>(steps), kWarmup);
    std::printf(
        "checkpoint %.1f MiB FP32 -> %.1f MiB (%lld tensors NVFP4, the rest BF16); model state in memory: "
        "FP32 %.1f MiB, NVFP4 model %.1f MiB dense beside its NVFP4 weights\n",
        report.total.bytes_in / 1048576.0, report.total.bytes_out / 1048576.0,
        static_cast<long long>(slm::model::nvfp4_weights(quant).size()), state_bytes(dense) / 1048576.0,
        state_bytes(quant) / 1048576.0);
    std::printf("%8s %12s %12s %8s %16s\n", "threads", "FP32 tok/s", "NVFP4 tok/s", "ratio", "logits rel diff");
    for (int t : threads) {
      torch::set_num_threads(t);
      Run f = decode(dense, steps), q = decode(quant, steps);
      const double diff = ((q.first_logits - f.first_logits).norm() / f.first_logits.norm()).item<double>();
      std::printf("%8d %12.2f %12.2f %7.2fx %16.3f\n", t, f.tokens_per_s, q.tokens_per_s,
                  q.tokens_per_s / f.tokens_per_s, diff);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvfp4_model_bench: %s\n", e.what());
    return 2;
  }
}
