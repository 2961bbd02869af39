#include <torch/torch.h>
#include <unistd.h>

#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "slm/data/byte_tokenizer.h"
#include "slm/engine/generation.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/sampler.h"
#include "slm/model/weights.h"
#include "slm/train/checkpoint.h"
#include "slm/train/evaluate.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::cli {

namespace {

struct GenerateOptions {
  std::string recipe;
  std::string checkpoint;
  std::string tokenizer;
  std::string prompt;
  int64_t max_tokens = 64;
  uint64_t seed = 0;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  bool stop_at_eos = false;
  std::string device = "cpu";
  bool no_cuda_graph = false;
};

void run_generate(GenerateOptions o) {
  Recipe r = load_recipe(o.recipe);
  if (!o.checkpoint.empty())  // a run directory means its latest checkpoint
    if (auto latest = train::latest_checkpoint(o.checkpoint); !latest.empty()) o.checkpoint = latest;
  if (o.max_tokens < 1) throw Error("--max-tokens must be at least 1");
  const torch::Device device = parse_device(o.device);
  std::string tokenizer = o.tokenizer;
  if (tokenizer.empty() && !o.checkpoint.empty()) tokenizer = train::checkpoint_tokenizer(o.checkpoint);
  const bool bytes = tokenizer.empty() || tokenizer == "byte";
  if (bytes && r.vocab_size < data::ByteTokenizer::kVocabSize)
    throw Error(o.recipe + ": vocab_size " + std::to_string(r.vocab_size) + " is smaller than the byte tokenizer's " +
                std::to_string(data::ByteTokenizer::kVocabSize) + " ids");
  std::cerr << "slm: tokenizer " << (bytes ? "byte-level" : tokenizer) << "\n";
  torch::manual_seed(o.seed);
  model::HybridLM m(r);  // initialized on the CPU, so a seed gives the same random weights on every device
  m.eval();
  // Moved before the weights load: NVFP4 matrices, which are no registered tensors, are placed on the device of the
  // weight they replace as they load.
  m.to(device);
  if (o.checkpoint.empty()) {
    std::cerr << "slm: warning: no checkpoint loaded: the weights are RANDOM (initialized from seed " << o.seed
              << "), so the output is noise\n";
  } else {
    model::load_weights(m, model::weights_path(o.checkpoint));
    const auto quantized = model::nvfp4_weights(m);
    if (!quantized.empty())
      std::cerr << "slm: NVFP4 checkpoint: " << quantized.size() << " weights run in NVFP4, dequantized on the fly\n";
  }
  engine::GenerationOptions go;
  go.max_tokens = o.max_tokens;
  go.cuda_graph = !o.no_cuda_graph;
  go.sampling = {o.temperature, o.top_k, o.top_p, o.seed};

  std::vector<int64_t> ids;
  engine::GenerationStats stats;
  if (!bytes) {
    auto tok = data::Tokenizer::load(tokenizer);
    ids = engine::generate_text(
        m, tok, o.prompt, go, [](const std::string& t) { std::cout << t << std::flush; }, &stats);
  } else {
    data::ByteTokenizer tok;
    ids = engine::generate_byte_text(
        m, o.prompt, go, o.stop_at_eos, [&](int64_t id) { std::cout << tok.display(id) << std::flush; }, &stats);
  }
  std::cout << "\n";
  std::cerr << "slm: generated " << ids.size() << " tokens:";
  for (int64_t id : ids) std::cerr << " " << id;
  std::cerr << "\n";
  std::cerr << "slm: " << o.device << ": prefill of " << stats.prompt_tokens << " tokens + first token " << std::fixed
            << std::setprecision(1) << stats.prefill_s * 1e3 << " ms";
  if (stats.decode_steps > 0)
    std::cerr << "; decode " << stats.decode_steps << " tokens in " << std::setprecision(3) << stats.decode_s
              << " s = " << std::setprecision(1) << static_cast<double>(stats.decode_steps) / stats.decode_s
              << " tokens/s" << (stats.graph ? " (CUDA graph)" : "");
  std::cerr << "\n";
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* g = app.add_subcommand("generate",
                               "Generate text from a prompt with the checkpoint's code tokenizer (or the byte-level "
                               "one); without --checkpoint the weights are random (seeded)");
  g->add_option("--recipe", o->recipe, "recipe JSON file (vocab_size >= 259 for the byte-level tokenizer)")->required();
  g->add_option("--checkpoint", o->checkpoint,
                "weights: a safetensors file, a checkpoint directory holding model.safetensors (BF16/FP32, "
                "or NVFP4 from `slm quantize`) or a run directory (its latest checkpoint)");
  g->add_option("--tokenizer", o->tokenizer,
                "tokenizer .model, or 'byte' (default: the one the checkpoint was trained with, else byte-level)");
  g->add_option("--prompt", o->prompt, "prompt text")->required();
  g->add_option("--max-tokens", o->max_tokens, "tokens to generate")->capture_default_str();
  g->add_option("--seed", o->seed, "seed of the weight init and of the sampler")->capture_default_str();
  g->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  g->add_option("--top-k", o->top_k, "sample from the k most likely tokens (0 = all)")->capture_default_str();
  g->add_option("--top-p", o->top_p, "sample from the smallest set with this much mass")->capture_default_str();
  g->add_option("--device", o->device, "where the model runs: cpu or cuda")->capture_default_str();
  g->add_flag("--no-cuda-graph", o->no_cuda_graph, "run every CUDA decode step eagerly instead of replaying a graph");
  g->add_flag("--stop-at-eos", o->stop_at_eos,
              "byte-level: stop when <eos> is sampled (the code tokenizer always does)");
  g->callback([o] { run_generate(*o); });
}

}  // namespace slm::cli
