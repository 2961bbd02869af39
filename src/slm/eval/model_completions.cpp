#include "slm/eval/model_completions.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "slm/data/hashing.h"
#include "slm/engine/generation.h"
#include "slm/model/weights.h"
#include "slm/recipe/recipe.h"
#include "slm/train/checkpoint.h"
#include "slm/train/evaluate.h"
#include "slm/util/device.h"
#include "slm/util/error.h"
#include "slm/util/files.h"

namespace slm::eval {

namespace {

// The recipe a training checkpoint records beside its weights.
Recipe checkpoint_recipe(const std::string& checkpoint) {
  const std::string weights = model::weights_path(checkpoint);
  const std::string meta_path = weights.substr(0, weights.find_last_of('/') + 1) + "meta.json";
  if (weights.find('/') == std::string::npos || ::access(meta_path.c_str(), R_OK) != 0)
    throw Error(checkpoint +
                ": a weights file does not record its recipe; give the recipe it was trained from (--recipe)");
  const auto meta = nlohmann::json::parse(read_file(meta_path), nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("recipe_text") || !meta["recipe_text"].is_string())
    throw Error(meta_path + ": no recipe_text; give the recipe (--recipe)");
  return parse_recipe_text(meta["recipe_text"].get<std::string>(), meta_path);
}

}  // namespace

ModelCompletions::ModelCompletions(ModelSpec spec) : spec_(std::move(spec)) {
  if (spec_.max_tokens < 1) throw Error("--max-tokens must be at least 1");
  const torch::Device device = parse_device(spec_.device);
  if (!spec_.checkpoint.empty()) {
    if (::access(spec_.checkpoint.c_str(), F_OK) != 0) throw Error(spec_.checkpoint + ": no such checkpoint");
    if (auto latest = train::latest_checkpoint(spec_.checkpoint); !latest.empty()) spec_.checkpoint = latest;
  }
  if (spec_.checkpoint.empty() && spec_.recipe.empty())
    throw Error("give a checkpoint (--model) or a recipe (--recipe)");
  const Recipe recipe = spec_.recipe.empty() ? checkpoint_recipe(spec_.checkpoint) : load_recipe(spec_.recipe);
  std::string tokenizer = spec_.tokenizer;
  if (tokenizer.empty() && !spec_.checkpoint.empty()) tokenizer = train::checkpoint_tokenizer(spec_.checkpoint);
  if (!tokenizer.empty() && tokenizer != "byte") tokenizer_ = data::Tokenizer::load(tokenizer);
  torch::manual_seed(spec_.seed);
  model_ = std::make_unique<model::HybridLM>(recipe, torch::TensorOptions().dtype(torch::kFloat).device(device));
  model_->eval();
  if (!spec_.checkpoint.empty()) model::load_weights(*model_, model::weights_path(spec_.checkpoint));
  description_ = "model " + recipe.name + " (" +
                 (spec_.checkpoint.empty() ? "RANDOM weights, seed " + std::to_string(spec_.seed)
                                           : model::weights_path(spec_.checkpoint)) +
                 "), tokenizer " + (tokenizer_ ? tokenizer : std::string("byte-level")) + ", " +
                 (spec_.temperature == 0
                      ? std::string("greedy")
                      : "temperature " + std::to_string(spec_.temperature) + ", top-p " + std::to_string(spec_.top_p)) +
                 ", up to " + std::to_string(spec_.max_tokens) + " tokens";
}

std::vector<std::string> ModelCompletions::complete(const Problem& problem, int n) {
  std::vector<std::string> out;
  for (int j = 0; j < n; ++j) {
    engine::GenerationOptions o;
    o.max_tokens = spec_.max_tokens;
    o.sampling = {spec_.temperature, spec_.top_k, spec_.top_p,
                  data::hash64(problem.name + "#" + std::to_string(j), spec_.seed)};
    o.stop_texts = problem.stop_tokens;
    std::string text;
    if (tokenizer_) {
      engine::generate_text(*model_, *tokenizer_, problem.prompt, o, [&](const std::string& t) { text += t; });
    } else {
      engine::generate_byte_text(*model_, problem.prompt, o, /*stop_at_eos=*/true, [&](int64_t id) {
        if (id < 256) text += static_cast<char>(id);
      });
    }
    out.push_back(std::move(text));
  }
  return out;
}

}  // namespace slm::eval
