#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "slm/data/byte_tokenizer.h"
#include "slm/engine/generation.h"
#include "slm/io/run_dir.h"
#include "slm/model/backend_summary.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/sampler.h"
#include "slm/model/weights.h"
#include "slm/recipe/ensemble.h"
#include "slm/server/prepare.h"
#include "slm/server/specialists.h"
#include "slm/text/text_generation.h"
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
  std::string ensemble;
  std::string model = "auto";
  bool random_weights = false;
  std::string prompt;
  int64_t max_tokens = 64;
  uint64_t seed = 0;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  double repetition_penalty = 1.0, presence_penalty = 0.0, frequency_penalty = 0.0;
  bool stop_at_eos = false;
  std::string device = "cpu";
  bool no_cuda_graph = false;
  int64_t speculative = 0;
};

engine::GenerationOptions generation_options(const GenerateOptions& o) {
  engine::GenerationOptions go;
  go.max_tokens = o.max_tokens;
  go.cuda_graph = !o.no_cuda_graph;
  go.speculative = o.speculative;
  go.sampling = {o.temperature,      o.top_k, o.top_p, o.seed, o.repetition_penalty, o.presence_penalty,
                 o.frequency_penalty};
  return go;
}

void print_text(const std::string& t) {
  std::cout << t << std::flush;
}

// After the streamed text: the ids, and where the time went.
void report(const std::vector<int64_t>& ids, const engine::GenerationStats& stats, const std::string& device) {
  std::cout << "\n";
  std::cerr << "slm: generated " << ids.size() << " tokens:";
  for (int64_t id : ids) std::cerr << " " << id;
  std::cerr << "\n";
  std::cerr << "slm: " << device << ": prefill of " << stats.prompt_tokens << " tokens + first token " << std::fixed
            << std::setprecision(1) << stats.prefill_s * 1e3 << " ms";
  if (stats.decode_steps > 0)
    std::cerr << "; decode " << stats.decode_steps << " tokens in " << std::setprecision(3) << stats.decode_s
              << " s = " << std::setprecision(1) << static_cast<double>(stats.decode_steps) / stats.decode_s
              << " tokens/s" << (stats.graph ? " (CUDA graph)" : "");
  if (stats.drafted > 0)
    std::cerr << "; speculative: " << stats.accepted << " of " << stats.drafted << " drafts accepted ("
              << std::setprecision(1)
              << 100.0 * static_cast<double>(stats.accepted) / static_cast<double>(stats.drafted) << "%)";
  std::cerr << "\n";
}

// One model from its recipe (and checkpoint): the code tokenizer it was trained with, or the byte-level one.
void generate_single(GenerateOptions o) {
  Recipe r = load_recipe(o.recipe);
  if (!o.checkpoint.empty()) o.checkpoint = io::resolve_run_dir(o.checkpoint);
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
  std::cerr << "slm: layers run " << model::backend_summary(m) << "\n";
  const engine::GenerationOptions go = generation_options(o);
  std::vector<int64_t> ids;
  engine::GenerationStats stats;
  if (!bytes) {
    auto tok = data::Tokenizer::load(tokenizer);
    ids = text::generate_text(m, tok, o.prompt, go, print_text, &stats);
  } else {
    data::ByteTokenizer tok;
    ids = text::generate_byte_text(
        m, o.prompt, go, o.stop_at_eos, [&](int64_t id) { std::cout << tok.display(id) << std::flush; }, &stats);
  }
  report(ids, stats, o.device);
}

// A specialist of an ensemble, named or picked by the router from the prompt, exactly as `slm serve` picks it for
// a completion request (server::prepare_generation), so both answer a prompt with the same specialist.
void generate_with_ensemble(const GenerateOptions& o) {
  if (o.model == "auto-2")
    throw Error("generate: auto-2 (two specialists mixed) runs in slm serve and slm chat; give auto or a name");
  server::LoadOptions lo;
  lo.device = o.device;
  lo.allow_random_weights = o.random_weights;
  lo.seed = o.seed;
  lo.slots = 1;  // each specialist's engine stays idle: the chosen model runs below
  const Ensemble manifest = load_ensemble(o.ensemble);
  const auto specialists = server::Specialists::from_manifest(manifest, lo);
  if (o.model != "auto" && !specialists.find(o.model)) {
    std::string names;
    for (const auto& s : specialists.all()) names += (names.empty() ? "" : ", ") + s->name;
    throw Error("generate: " + o.ensemble + " has no specialist \"" + o.model + "\" (it has " + names + ", or auto)");
  }
  server::GenerationRequest request;
  request.chat = false;
  request.model = o.model;
  request.prompt = o.prompt;
  request.max_tokens = o.max_tokens;
  server::PreparedGeneration p;
  try {
    p = server::prepare_generation(specialists, request, o.max_tokens);
  } catch (const server::ApiError& e) {
    throw Error("generate: " + std::string(e.what()));
  }
  server::Specialist& sp = *p.specialist;
  std::cerr << "slm: answered by " << sp.name << " (weights " << sp.weights;
  if (!p.routing.is_null()) {
    // Best first; the router's view of the others says how close the call was.
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& [name, prob] : p.routing.items()) ranked.emplace_back(prob.get<double>(), name);
    std::sort(ranked.rbegin(), ranked.rend());
    std::cerr << "; router:";
    for (size_t i = 0; i < ranked.size() && i < 3; ++i)
      std::cerr << (i ? ", " : " ") << ranked[i].second << " " << std::fixed << std::setprecision(2) << ranked[i].first;
  }
  std::cerr << ")\n";
  if (sp.weights == "random") std::cerr << "slm: warning: " << sp.name << " runs RANDOM weights: the output is noise\n";
  engine::GenerationStats stats;
  std::vector<int64_t> ids;
  {
    std::lock_guard turn(*sp.model.in_use);  // the model is shared with the specialist's (idle) engine
    ids = text::generate_text(*sp.model.model, *sp.tokenizer, o.prompt, generation_options(o), print_text, &stats);
  }
  report(ids, stats, o.device);
}

void run_generate(GenerateOptions o) {
  if (o.max_tokens < 1) throw Error("--max-tokens must be at least 1");
  if (!o.recipe.empty()) {
    if (!o.ensemble.empty()) throw Error("generate: give --recipe or --ensemble, not both");
    if (o.model != "auto") throw Error("generate: --model picks a specialist of an --ensemble, not of --recipe");
    if (o.random_weights)
      throw Error("generate: --random-weights is for --ensemble (--recipe without --checkpoint runs random weights)");
    generate_single(std::move(o));
    return;
  }
  if (!o.checkpoint.empty() || !o.tokenizer.empty())
    throw Error("generate: --checkpoint and --tokenizer go with --recipe (an ensemble's manifest names its own)");
  if (o.ensemble.empty()) {
    o.ensemble = default_ensemble_path();
    if (o.ensemble.empty())
      throw Error("generate: give --recipe R (with --checkpoint C) or --ensemble M; " +
                  default_ensemble_missing_note());
    std::cerr << "slm: no model given: the shipped ensemble " << o.ensemble << "\n";
  }
  generate_with_ensemble(o);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* g = app.add_subcommand(
      "generate",
      "Generate text from a prompt: with a specialist of an ensemble (the shipped models/ensemble.json when no model "
      "is given; the router picks one from the prompt) or one recipe with the checkpoint's code tokenizer (or the "
      "byte-level one; without --checkpoint the weights are random, seeded)");
  g->add_option("--ensemble", o->ensemble,
                "ensemble manifest (default when neither --ensemble nor --recipe is given: the shipped "
                "models/ensemble.json, looked for in the working directory, then next to the program's build "
                "directory)");
  g->add_option("--model", o->model,
                "with an ensemble: the specialist's name, or auto (the router picks from the prompt)")
      ->capture_default_str();
  g->add_flag("--random-weights", o->random_weights,
              "with an ensemble: run specialists without a checkpoint on seeded random weights (smoke tests)");
  g->add_option("--recipe", o->recipe, "one model: recipe JSON file (vocab_size >= 259 for the byte-level tokenizer)");
  g->add_option("--checkpoint", o->checkpoint,
                "one model's weights: a safetensors file, a checkpoint directory holding model.safetensors (BF16/FP32, "
                "or NVFP4 from `slm quantize`) or a run directory (its latest checkpoint)");
  g->add_option(
      "--tokenizer", o->tokenizer,
      "one model's tokenizer .model, or 'byte' (default: the one the checkpoint was trained with, else byte-level)");
  g->add_option("--prompt", o->prompt, "prompt text")->required();
  g->add_option("--max-tokens", o->max_tokens, "tokens to generate")->capture_default_str();
  g->add_option("--seed", o->seed, "seed of the weight init and of the sampler")->capture_default_str();
  g->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  g->add_option("--top-k", o->top_k, "sample from the k most likely tokens (0 = all)")->capture_default_str();
  g->add_option("--top-p", o->top_p, "sample from the smallest set with this much mass")->capture_default_str();
  g->add_option("--repetition-penalty", o->repetition_penalty,
                "divide the positive logits (multiply the negative ones) of tokens already in the prompt or the output "
                "by this (1 = off; 1.1 is common)")
      ->capture_default_str();
  g->add_option("--presence-penalty", o->presence_penalty,
                "subtract this from the logits of tokens already generated (-2..2, as OpenAI's)")
      ->capture_default_str();
  g->add_option("--frequency-penalty", o->frequency_penalty,
                "subtract this times the count of each token already generated (-2..2, as OpenAI's)")
      ->capture_default_str();
  g->add_option("--device", o->device, "where the model runs: cpu or cuda")->capture_default_str();
  g->add_flag("--no-cuda-graph", o->no_cuda_graph, "run every CUDA decode step eagerly instead of replaying a graph");
  g->add_option("--speculative", o->speculative,
                "speculative decoding: the MTP modules draft this many tokens per step (1..the recipe's MTP depth; "
                "0 = off), one forward verifies them; greedy output is unchanged")
      ->capture_default_str();
  g->add_flag("--stop-at-eos", o->stop_at_eos,
              "byte-level: stop when <eos> is sampled (the code tokenizer always does)");
  g->callback([o] { run_generate(*o); });
}

}  // namespace slm::cli
