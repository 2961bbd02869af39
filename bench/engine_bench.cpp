// Aggregate generation speed of the engine with many clients at once: continuous batching against the
// one-request-at-a-time engine, measured in the same run on the same model.
//   engine_bench [--recipe R] [--device cpu|cuda] [--dtype fp32|bf16] [--nvfp4 [--quantize-head]] [--requests 64]
//                [--slots 64] [--prompt-tokens 128] [--max-tokens 128] [--serial-requests 4] [--no-graph]
//                [--temperature 0] [--top-p 1] [--repetition-penalty 1] [--profile]
// Random weights (random_weights.h; --nvfp4: the matrices `slm quantize` quantizes in NVFP4, random codes). Every
// request has its own random prompt and decodes (greedily by default; sampled with its own seed at --temperature > 0)
// for exactly
// --max-tokens tokens (no stop ids). A run submits all its requests at once and ends when the last one is done;
// tokens/s = generated tokens / wall time, which includes the prompts' prefill (time to first token is reported
// apart). Each engine first serves the same wave with 8 new tokens per request, untimed, so CUDA graph captures and
// allocator growth fall outside the timed run. The one-at-a-time engine serves --serial-requests requests (its speed
// does not depend on how many wait). --profile: two more runs of the continuous-batching wave, profiled through
// slm::train::Profiler (the GPU kernels, then the host's operators), their summaries printed.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "random_weights.h"
#include "slm/engine/batch_engine.h"
#include "slm/engine/decode_engine.h"
#include "slm/model/hybrid_lm.h"
#include "slm/recipe/recipe.h"
#include "slm/train/profile.h"
#include "slm/util/device.h"
#include "slm/util/error.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kWarmupTokens = 8;  // new tokens per request of the untimed first wave

struct Options {
  std::string recipe = std::string(SLM_SOURCE_DIR) + "/recipes/specialist-small.json";
  std::string device = "cpu";
  std::string dtype = "fp32";
  int64_t requests = 64, slots = 64, prompt = 128, max_tokens = 128, serial_requests = 4;
  bool no_graph = false, nvfp4 = false, quantize_head = false, profile = false;
  slm::engine::Sampling sampling{0.0, 1.0, 0, 0};
};

struct Run {
  double seconds = 0;
  int64_t tokens = 0;
  std::vector<double> first_token_ms, latency_ms;  // per request, from the common submit time
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// Submits `count` requests at once and waits for all of them.
Run serve(slm::engine::Engine& engine, int64_t count, int64_t prompt, int64_t max_tokens, int64_t vocab,
          slm::engine::Sampling sampling) {
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0;
  Run run;
  run.first_token_ms.assign(static_cast<size_t>(count), 0);
  run.latency_ms.assign(static_cast<size_t>(count), 0);
  std::vector<int64_t> tokens(static_cast<size_t>(count), 0);
  std::vector<std::string> errors;
  const auto start = Clock::now();
  auto ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
  for (int64_t i = 0; i < count; ++i) {
    auto ids = torch::randint(3, vocab, {prompt}, torch::kLong);
    sampling.seed = static_cast<uint64_t>(i);
    slm::engine::Request r{
        std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + prompt), sampling, max_tokens, {}};
    const auto k = static_cast<size_t>(i);
    engine.submit(std::move(r), {[&, k](int64_t) {
                                   std::lock_guard l(mu);
                                   if (tokens[k]++ == 0) run.first_token_ms[k] = ms();
                                 },
                                 [&, k](const slm::engine::Result& res) {
                                   std::lock_guard l(mu);
                                   run.latency_ms[k] = ms();
                                   if (res.finish == slm::engine::Finish::kError) errors.push_back(res.error);
                                   ++done;
                                   cv.notify_all();
                                 }});
  }
  std::unique_lock l(mu);
  cv.wait(l, [&] { return done == count; });
  run.seconds = ms() / 1000.0;
  if (!errors.empty()) throw slm::Error("engine_bench: a request failed: " + errors[0]);
  for (int64_t t : tokens) run.tokens += t;
  return run;
}

void report(const char* name, const Run& r, int64_t count) {
  std::printf(
      "%-26s %5lld requests  %9.1f tok/s  first token p50 %8.1f ms p99 %8.1f ms  done p50 %8.1f ms p99 %8.1f ms\n",
      name, static_cast<long long>(count), static_cast<double>(r.tokens) / r.seconds, percentile(r.first_token_ms, 0.5),
      percentile(r.first_token_ms, 0.99), percentile(r.latency_ms, 0.5), percentile(r.latency_ms, 0.99));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"engine_bench: continuous batching against one request at a time"};
  Options o;
  app.add_option("--recipe", o.recipe, "recipe JSON")->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", o.dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  app.add_option("--requests", o.requests, "requests submitted at once")->capture_default_str();
  app.add_option("--slots", o.slots, "the batching engine's sequence slots")->capture_default_str();
  app.add_option("--prompt-tokens", o.prompt, "prompt length of every request")->capture_default_str();
  app.add_option("--max-tokens", o.max_tokens, "tokens generated per request")->capture_default_str();
  app.add_option("--serial-requests", o.serial_requests, "requests for the one-at-a-time engine (0: skip it)")
      ->capture_default_str();
  app.add_flag("--no-graph", o.no_graph, "decode eagerly on CUDA (no CUDA graphs)");
  app.add_flag("--nvfp4", o.nvfp4, "quantize the quantizable matrices to NVFP4, as slm quantize does");
  app.add_flag("--quantize-head", o.quantize_head, "with --nvfp4: the LM head in NVFP4 too");
  app.add_option("--temperature", o.sampling.temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-p", o.sampling.top_p, "nucleus mass when sampling")->capture_default_str();
  app.add_option("--repetition-penalty", o.sampling.repetition_penalty, "1: none")->capture_default_str();
  app.add_flag("--profile", o.profile, "also profile the continuous-batching wave (GPU kernels, host operators)");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto recipe = slm::load_recipe(o.recipe);
    const auto device = slm::parse_device(o.device);
    const auto dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
    std::shared_ptr<slm::model::HybridLM> model =
        slm::bench::random_model(recipe, dtype, device, o.nvfp4, o.quantize_head);
    const int64_t context = o.prompt + std::max(o.max_tokens, kWarmupTokens);
    std::printf(
        "engine_bench: %s on %s (%s%s), %lld-token prompts, %lld new tokens each, %lld slots%s, temperature %g top-p "
        "%g repetition penalty %g\n",
        recipe.name.c_str(), o.device.c_str(), o.dtype.c_str(),
        o.nvfp4 ? (o.quantize_head ? ", NVFP4 matrices and head" : ", NVFP4 matrices") : "",
        static_cast<long long>(o.prompt), static_cast<long long>(o.max_tokens), static_cast<long long>(o.slots),
        o.no_graph ? ", no graphs" : "", o.sampling.temperature, o.sampling.top_p, o.sampling.repetition_penalty);
    torch::manual_seed(2);
    slm::engine::DecodeEngineOptions eo;
    eo.max_queue = static_cast<size_t>(std::max(o.requests, o.serial_requests));
    eo.context_length = context;
    eo.cuda_graph = !o.no_graph;
    double serial = 0;
    if (o.serial_requests > 0) {
      eo.slots = 1;
      auto engine = slm::engine::make_decode_engine(model, eo);
      serve(*engine, 1, o.prompt, kWarmupTokens, recipe.vocab_size, o.sampling);
      const auto r = serve(*engine, o.serial_requests, o.prompt, o.max_tokens, recipe.vocab_size, o.sampling);
      report("one at a time", r, o.serial_requests);
      serial = static_cast<double>(r.tokens) / r.seconds;
    }
    eo.slots = o.slots;
    auto engine = slm::engine::make_batch_engine({model}, eo);
    serve(*engine, o.requests, o.prompt, kWarmupTokens, recipe.vocab_size, o.sampling);
    const auto r = serve(*engine, o.requests, o.prompt, o.max_tokens, recipe.vocab_size, o.sampling);
    report("continuous batching", r, o.requests);
    if (serial > 0)
      std::printf("ratio: continuous batching / one at a time = %.2fx\n",
                  static_cast<double>(r.tokens) / r.seconds / serial);
    for (const bool gpu : {true, false}) {
      if (!o.profile || (gpu && !device.is_cuda())) continue;
      slm::train::Profiler profiler;
      profiler.start(gpu);
      serve(*engine, o.requests, o.prompt, o.max_tokens, recipe.vocab_size, o.sampling);
      std::printf("%s", profiler.stop(1).text(40).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
