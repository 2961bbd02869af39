#pragma once
// What the server serves: the specialists (each a model behind its own engine, with its tokenizer and chat
// template) and the router that picks one for `model: "auto"`. Loaded from an ensemble manifest or from a single
// recipe + checkpoint; no HTTP here.
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "slm/data/tokenizer.h"
#include "slm/text/chat_template.h"
#include "slm/engine/decode_engine.h"
#include "slm/engine/engine.h"
#include "slm/recipe/ensemble.h"
#include "slm/router/classifier.h"

namespace slm::model {
class HybridLM;
}

namespace slm::server {

struct Specialist {
  std::string name, description;
  std::vector<std::string> routes;  // router labels it answers
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<text::ChatTemplate> chat;
  std::unique_ptr<engine::Engine> engine;
  engine::EngineModel model;  // shared with the mixtures the specialist takes part in
  std::string weights;        // the weights file, or "random" when none was loaded
  int64_t parameters = 0;     // dense parameter count (NVFP4 matrices released their dense weights)
  int64_t weight_bytes = 0;   // everything the weights occupy (model::weight_memory), NVFP4 at its packed size
  int64_t nvfp4_bytes = 0;    // of which NVFP4
};

struct LoadOptions {
  std::string device = "cpu";         // where the models run ("cuda" when built with CUDA)
  bool allow_random_weights = false;  // serve a specialist without a checkpoint (tests, smoke runs)
  uint64_t seed = 0;                  // the random weights' seed (specialist i of a manifest: seed + i)
  size_t max_queue = 64;              // waiting requests per specialist
  int64_t slots = 8;                  // sequences each specialist generates at once (continuous batching)
  int64_t prefix_cache_mib = 512;     // each specialist's prompt-prefix state cache (0: off)
};

// The router's choice: specialists by probability (the mass of the labels each answers, renormalised over the
// labels some specialist answers), best first.
struct Route {
  size_t specialist = 0;
  std::vector<std::pair<std::string, double>> probabilities;
};

class Specialists {
 public:
  // Every specialist of the manifest (its checkpoint, NVFP4 when quantized, and tokenizer), plus its router when
  // the manifest names one. log (optional) receives one line per loaded specialist. Throws slm::Error naming the
  // specialist and file for a missing checkpoint (unless allow_random_weights) or tokenizer, a tokenizer whose ids
  // do not fit the recipe, or a router none of whose labels a specialist answers.
  static Specialists from_manifest(const Ensemble& ensemble, const LoadOptions& options,
                                   const std::function<void(const std::string&)>& log = {});
  // One model, named after its recipe.
  static Specialists single(const std::string& recipe_path, const std::string& checkpoint, const std::string& tokenizer,
                            const LoadOptions& options);

  // A specialist over a model already built (tests, `slm chat`); the engine takes a share of the model.
  void add(std::string name, std::shared_ptr<model::HybridLM> model, std::unique_ptr<data::Tokenizer> tokenizer,
           std::vector<std::string> routes, const LoadOptions& options, std::string weights = "random");
  void set_router(router::Classifier router);

  const std::vector<std::unique_ptr<Specialist>>& all() const { return list_; }
  Specialist* find(const std::string& name) const;
  bool has_router() const { return router_.has_value(); }
  // Throws slm::Error when no router is loaded.
  Route route(const std::string& text) const;

  // The engine of the token-level mixture of specialists a and b (indices into all(); created on first use and
  // kept), or null when their tokenizers differ (their ids would not mean the same tokens). Its
  // Request::mixture_weights are in index order: min(a, b) first.
  engine::Engine* mixture(size_t a, size_t b) const;

 private:
  std::vector<std::unique_ptr<Specialist>> list_;
  std::optional<router::Classifier> router_;
  size_t max_queue_ = 64;
  struct Mixtures {
    std::mutex mu;
    std::map<std::pair<size_t, size_t>, std::unique_ptr<engine::Engine>> engines;  // null: tokenizers differ
  };
  std::unique_ptr<Mixtures> mixtures_ = std::make_unique<Mixtures>();
};

}  // namespace slm::server
