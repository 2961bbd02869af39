// Batch-1 decode speed of whole models, as a fraction of the memory roofline.
//   decode_bench [--recipe R]... [--device cpu|cuda] [--dtype fp32|bf16] [--nvfp4 [--quantize-head]] [--prompt-tokens
//   128]
//                [--steps 64] [--batch 1] [--graph] [--moe-paths] [--profile] [--unfused] [--resident [--state-tokens
//                N]]
//   (default recipes: recipes/specialist-small.json and recipes/tiny-hybrid.json)
// Random weights (N(0, 1/fan_in) for matrices, so no projection is the zero matrix a fresh model starts with); with
// --nvfp4 every matrix `slm quantize` quantizes runs nvfp4::linear with random codes (random_weights.h; with
// --quantize-head the LM head too, as `slm quantize --quantize-head` writes it). One batched prefill of
// the prompt (timed once, after an untimed prefill of the same length in another state), then greedy decode: a step is
// one HybridLM::decode plus the argmax that picks the next token, on the device. Reported: the median step over
// --steps steps after 2 warm-up steps, tokens/s = batch / median step.
// Roofline: the weight bytes one step must read (every parameter of the main stack but the embedding, of which it
// gathers batch rows, and the MTP modules, which decode does not run; routed experts as min(1, batch·k/E) of them,
// NVFP4 matrices at their packed size) over the memory bandwidth measured in the same run: a copy of 1 GiB on the
// device, counted as bytes read + written per second (STREAM's convention), best of 5. KV cache and recurrent-state
// reads are left out, so the roofline is an upper bound.
// --graph: the decode steps replay one CUDA graph (engine::GraphDecoder) instead of running the model eagerly.
// --profile: after the timed steps, profiles one prefill and --steps more decode steps through slm::train::Profiler
// (once for the GPU kernels on CUDA, once for the host's operators) and prints the summaries.
// --unfused: the inference-only fused kernels (ops/fused_kernels.h) off, for a same-machine before/after.
// --resident (CUDA): every --recipe loaded at once, each holding a batch-1 decode state of --state-tokens tokens
// (default 8192) filled by a prefill of that length: the device memory of each model's weights and state and of all
// together (live tensors, and what the caching allocator reserved), set against the accounting's bytes, then
// --steps graphed decode steps of each model while all stay resident.
// --moe-paths: instead, the routed experts of each recipe's MoE layer alone, model::loop_experts against
// model::gathered_experts for 1..32 tokens (median of 50 calls each): the measurement behind the MoE table's
// gathered-decode bound (model::plan_experts); "rule" is the backend the layer runs for that many tokens.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "median_timer.h"
#include "random_weights.h"
#include "slm/engine/graph_decoder.h"
#include "slm/model/hybrid_lm.h"
#include "slm/ops/fused_kernels.h"
#include "slm/quant/nvfp4_linear.h"
#include "slm/recipe/accounting.h"
#include "slm/recipe/recipe.h"
#include "slm/server/metrics.h"
#include "slm/train/profile.h"
#include "slm/util/device.h"
#include "slm/util/error.h"

namespace {

struct Options {
  std::vector<std::string> recipes;
  std::string device = "cpu";
  std::string dtype = "fp32";
  bool nvfp4 = false;
  bool quantize_head = false;
  int64_t prompt = 128;
  int64_t steps = 64;
  int64_t batch = 1;
  bool moe_paths = false;
  bool profile = false;
  bool unfused = false;
  bool graph = false;
  bool resident = false;
  int64_t state_tokens = 8192;
};

constexpr int kWarmup = 2;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

std::unique_ptr<slm::model::HybridLM> build(const slm::Recipe& recipe, const Options& o, const torch::Device& device) {
  return slm::bench::random_model(recipe, o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat, device, o.nvfp4,
                                  o.quantize_head);
}

// Bytes of weights one decode step reads (see the header comment).
double step_weight_bytes(const slm::model::HybridLM& m, int64_t batch) {
  const auto& moe = m.recipe().moe;
  const double expert_share =
      moe ? std::min(1.0, static_cast<double>(batch * moe->experts_per_token) / moe->routed_experts) : 1.0;
  auto is_routed = [](const std::string& name) { return name.find(".moe.experts.") != std::string::npos; };
  double bytes = 0;
  for (const auto& p : m.named_parameters()) {
    const std::string& name = p.key();
    if (name == "embed.weight" || name.rfind("mtp.", 0) == 0 || name.find(".engram.table") != std::string::npos)
      continue;
    const double b = static_cast<double>(p.value().numel()) * static_cast<double>(p.value().element_size());
    bytes += is_routed(name) ? b * expert_share : b;
  }
  // NVFP4 matrices: their dense parameter is empty; the packed codes and scales are what is read.
  for (const auto& item : m.named_modules("", /*include_self=*/false)) {
    if (item.key().rfind("mtp.", 0) == 0) continue;
    if (auto* lin = item.value()->as<slm::model::LinearImpl>(); lin && lin->weight.is_nvfp4())
      bytes += static_cast<double>(lin->weight.bytes());
    if (auto* ex = item.value()->as<slm::model::ExpertsImpl>())
      for (const auto* w : {&ex->w13, &ex->w2})
        if (w->is_nvfp4()) bytes += static_cast<double>(w->bytes()) * expert_share;
  }
  return bytes;
}

// Memory bandwidth of the device: a 1 GiB copy, (read + written bytes) / time, best of 5.
double copy_bandwidth(const torch::Device& device) {
  const int64_t n = int64_t{1} << 28;  // floats: 1 GiB
  auto src = torch::ones({n}, torch::TensorOptions().device(device));
  auto dst = torch::empty_like(src);
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    sync(device);
    const double t0 = now_ms();
    dst.copy_(src);
    sync(device);
    if (i > 0) best = std::max(best, 2.0 * 4.0 * static_cast<double>(n) / ((now_ms() - t0) * 1e-3));
  }
  return best;
}

struct Timing {
  double prefill_ms = 0;
  double step_ms = 0;  // median
};

Timing run_decode(slm::model::HybridLM& m, const Options& o, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  const int64_t capacity = o.prompt + kWarmup + o.steps;
  auto prompt = torch::randint(m.recipe().vocab_size, {o.batch, o.prompt}, torch::kLong).to(device);
  {  // the first prefill pays one-off costs (allocator, kernel selection, tables)
    auto warm = m.new_state(o.batch, capacity);
    m.prefill_last(prompt, warm);
  }
  auto state = m.new_state(o.batch, capacity);
  Timing t;
  sync(device);
  double t0 = now_ms();
  auto logits = m.prefill_last(prompt, state);
  sync(device);
  t.prefill_ms = now_ms() - t0;
  std::unique_ptr<slm::engine::GraphDecoder> graph;
  if (o.graph) graph = std::make_unique<slm::engine::GraphDecoder>(m, state);
  auto decode = [&](const torch::Tensor& token) { return graph ? graph->step(token) : m.decode(token, state); };
  std::vector<double> ms;
  for (int64_t i = 0; i < kWarmup + o.steps; ++i) {
    t0 = now_ms();
    logits = decode(logits.argmax(-1));
    sync(device);
    if (i >= kWarmup) ms.push_back(now_ms() - t0);
  }
  std::sort(ms.begin(), ms.end());
  t.step_ms = ms[ms.size() / 2];
  graph.reset();
  if (o.profile) {
    // Room for the profiled steps: a fresh state, prefilled like the timed one.
    auto more = m.new_state(o.batch, o.prompt + 2 * o.steps);
    torch::Tensor next;
    for (const bool gpu : {true, false}) {  // the prefill, profiled like the steps (the last run fills `more`)
      if (gpu && !device.is_cuda()) continue;
      auto scratch = m.new_state(o.batch, o.prompt + 2 * o.steps);
      auto& target = gpu ? scratch : more;
      slm::train::Profiler profiler;
      profiler.start(gpu);
      next = m.prefill_last(prompt, target).argmax(-1);
      std::printf("prefill of %lld x %lld tokens:\n%s", static_cast<long long>(o.batch),
                  static_cast<long long>(o.prompt), profiler.stop(1).text(40).c_str());
    }
    if (o.graph) graph = std::make_unique<slm::engine::GraphDecoder>(m, more);
    auto step = [&](const torch::Tensor& token) { return graph ? graph->step(token) : m.decode(token, more); };
    for (const bool gpu : {true, false}) {
      if (gpu && !device.is_cuda()) continue;
      slm::train::Profiler profiler;
      profiler.start(gpu);
      for (int64_t i = 0; i < o.steps; ++i) next = step(next).argmax(-1);
      std::printf("%s", profiler.stop(o.steps).text(60).c_str());
    }
  }
  return t;
}

void compare_moe_paths(const slm::Recipe& recipe, const Options& o, const torch::Device& device) {
  if (!recipe.moe) {
    std::printf("%s: no MoE layers\n", recipe.name.c_str());
    return;
  }
  const auto dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  slm::model::MoE moe(recipe, options);
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  for (auto& p : moe->parameters()) p.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(-1))));
  std::printf("%s: %lld experts top-%lld, d %lld, hidden %lld\n", recipe.name.c_str(),
              static_cast<long long>(moe->num_experts), static_cast<long long>(moe->top_k),
              static_cast<long long>(recipe.d_model), static_cast<long long>(recipe.moe->expert_hidden));
  std::printf("%8s %12s %12s %14s %20s\n", "tokens", "loop ms", "gathered ms", "loop/gathered", "rule");
  for (int64_t n : {1, 2, 4, 8, 16, 32}) {
    auto u = torch::randn({n, recipe.d_model}, options);
    auto routing = moe->route_tokens(u);
    auto time = [&](auto path) {
      return slm::bench::median_ms([&] { path(u, routing, *moe->experts); }, 50, device.is_cuda());
    };
    const double loop = time(slm::model::loop_experts), gathered = time(slm::model::gathered_experts);
    std::printf("%8lld %12.3f %12.3f %13.2fx %20s\n", static_cast<long long>(n), loop, gathered, loop / gathered,
                moe->experts_backend(u).name());
  }
}

// --resident: see the header comment.
void resident(const Options& o, const torch::Device& device) {
  if (!device.is_cuda()) throw slm::Error("--resident measures device memory: it needs --device cuda");
  torch::NoGradGuard no_grad;
  const auto mib = [](double b) { return b / 1048576.0; };
  const auto allocated = [&] {
    torch::cuda::synchronize();
    return static_cast<double>(slm::server::process_memory().cuda_allocated_bytes);
  };
  struct Held {
    slm::Recipe recipe;
    std::unique_ptr<slm::model::HybridLM> model;
    slm::model::DecodeState state;
    torch::Tensor next;
  };
  std::vector<Held> held;
  double weights_total = 0, states_total = 0, accounted_total = 0;
  std::printf("%-14s %9s %9s %13s %12s %11s %10s\n", "recipe", "total", "active", "weights MiB", "accounted",
              "state MiB", "prefill s");
  for (const auto& path : o.recipes) {
    Held h{slm::load_recipe(path), nullptr, {}, {}};
    const double before = allocated();
    h.model = build(h.recipe, o, device);
    const double loaded = allocated();
    const auto acc = slm::account(h.recipe, h.model->plan());
    // The accounting's bytes of the form loaded: NVFP4 packs the eligible matrices (the head too with
    // --quantize-head only when the accounting counts it so; the difference shows in the table).
    const double accounted = static_cast<double>(o.nvfp4 ? acc.bytes_nvfp4 : acc.bytes_bf16);
    h.state = h.model->new_state(1, o.state_tokens);
    torch::manual_seed(4);
    const auto prompt = torch::randint(h.recipe.vocab_size, {1, o.state_tokens - kWarmup - o.steps}, torch::kLong);
    const double t0 = now_ms();
    h.next = h.model->prefill_last(prompt.to(device), h.state).argmax(-1);
    const double prefill_s = (now_ms() - t0) / 1000.0;
    const double filled = allocated();
    weights_total += loaded - before;
    states_total += filled - loaded;
    accounted_total += accounted;
    std::printf("%-14s %8.2fB %8.2fB %13.0f %11.0f %11.0f %10.2f\n", h.recipe.name.c_str(),
                static_cast<double>(acc.total) / 1e9, static_cast<double>(acc.active) / 1e9, mib(loaded - before),
                mib(accounted), mib(filled - loaded), prefill_s);
    held.push_back(std::move(h));
  }
  const auto mem = slm::server::process_memory();
  std::printf(
      "%zu models resident: weights %.2f GiB (accounted %.2f GiB), states %.2f GiB; allocated %.2f GiB, "
      "reserved %.2f GiB\n",
      held.size(), weights_total / 1073741824.0, accounted_total / 1073741824.0, states_total / 1073741824.0,
      static_cast<double>(mem.cuda_allocated_bytes) / 1073741824.0,
      static_cast<double>(mem.cuda_reserved_bytes) / 1073741824.0);
  std::printf("%-14s %10s %9s\n", "recipe", "ms/step", "tok/s");
  for (auto& h : held) {
    slm::engine::GraphDecoder graph(*h.model, h.state);
    std::vector<double> ms;
    for (int64_t i = 0; i < kWarmup + o.steps; ++i) {
      const double t0 = now_ms();
      h.next = graph.step(h.next).argmax(-1);
      torch::cuda::synchronize();
      if (i >= kWarmup) ms.push_back(now_ms() - t0);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-14s %10.3f %9.1f\n", h.recipe.name.c_str(), ms[ms.size() / 2], 1000.0 / ms[ms.size() / 2]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"batch-1 decode speed against the memory roofline"};
  app.add_option("--recipe", o.recipes, "recipe JSON (repeatable; default specialist-small and tiny-hybrid)");
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", o.dtype, "fp32 or bf16: the model's parameters and activations")->capture_default_str();
  app.add_flag("--nvfp4", o.nvfp4, "quantize the quantizable matrices to NVFP4, as slm quantize does");
  app.add_flag("--quantize-head", o.quantize_head,
               "with --nvfp4: the LM head in NVFP4 too (slm quantize --quantize-head)");
  app.add_option("--prompt-tokens", o.prompt, "prompt length, prefilled in one call")->capture_default_str();
  app.add_option("--steps", o.steps, "timed decode steps")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences decoded together")->capture_default_str();
  app.add_flag("--graph", o.graph, "replay each decode step from a CUDA graph (engine::GraphDecoder)");
  app.add_flag("--profile", o.profile, "also profile --steps decode steps (GPU kernels, host operators)");
  app.add_flag("--unfused", o.unfused,
               "run the rotary + QK-norm, MoE routing and residual mix as tensor ops (ops/fused_kernels.h)");
  app.add_flag("--moe-paths", o.moe_paths, "time the MoE layer's routed-expert paths instead of whole models");
  app.add_flag("--resident", o.resident,
               "load every --recipe at once with a --state-tokens decode state each: device memory, then decode");
  app.add_option("--state-tokens", o.state_tokens, "with --resident: tokens each model's decode state holds")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.dtype != "fp32" && o.dtype != "bf16")
      throw slm::Error("--dtype must be fp32 or bf16 (got '" + o.dtype + "')");
    if (o.prompt < 1 || o.steps < 1 || o.batch < 1)
      throw slm::Error("--prompt-tokens, --steps and --batch must be at least 1");
    const torch::Device device = slm::parse_device(o.device);
    slm::ops::set_fused_kernels(!o.unfused);
    if (o.recipes.empty())
      o.recipes = {std::string(SLM_SOURCE_DIR) + "/recipes/specialist-small.json",
                   std::string(SLM_SOURCE_DIR) + "/recipes/tiny-hybrid.json"};
    if (o.resident) {
      if (o.state_tokens <= kWarmup + o.steps) throw slm::Error("--state-tokens must exceed the decode steps");
      resident(o, device);
      return 0;
    }
    if (o.moe_paths) {
      std::printf("device %s, %d intra-op threads, %s\n", o.device.c_str(), torch::get_num_threads(), o.dtype.c_str());
      for (const auto& path : o.recipes) compare_moe_paths(slm::load_recipe(path), o, device);
      return 0;
    }
    const double bandwidth = copy_bandwidth(device);
    std::printf(
        "device %s, %d intra-op threads, %s%s%s, batch %lld, prompt %lld, median of %lld steps after %d warm-up\n",
        o.device.c_str(), torch::get_num_threads(), o.dtype.c_str(),
        !o.nvfp4          ? ""
        : o.quantize_head ? " + NVFP4 matrices and head"
                          : " + NVFP4 matrices",
        o.unfused ? ", fused kernels off" : "", static_cast<long long>(o.batch), static_cast<long long>(o.prompt),
        static_cast<long long>(o.steps), kWarmup);
    std::printf("copy bandwidth %.1f GB/s (read + written)\n", bandwidth / 1e9);
    if (o.nvfp4 && !device.is_cuda())
      std::printf("NVFP4 CPU kernel: %s\n", slm::nvfp4::cpu_kernel_name(slm::nvfp4::CpuKernel::Auto));
    std::printf("%-18s %9s %11s %10s %9s %11s %10s %9s\n", "recipe", "active", "prefill ms", "ms/step", "tok/s",
                "MiB/step", "roof tok/s", "of roof");
    for (const auto& path : o.recipes) {
      const slm::Recipe recipe = slm::load_recipe(path);
      auto m = build(recipe, o, device);
      const auto accounting = slm::account(recipe, m->plan());
      const double bytes = step_weight_bytes(*m, o.batch);
      const Timing t = run_decode(*m, o, device);
      const double tok_s = 1000.0 * static_cast<double>(o.batch) / t.step_ms;
      const double roof = static_cast<double>(o.batch) * bandwidth / bytes;
      std::printf("%-18s %8.1fM %11.1f %10.3f %9.1f %11.1f %10.1f %8.1f%%\n", recipe.name.c_str(),
                  static_cast<double>(accounting.active) / 1e6, t.prefill_ms, t.step_ms, tok_s, bytes / 1048576.0, roof,
                  100.0 * tok_s / roof);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 2;
  }
}
