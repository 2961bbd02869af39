#include "slm/eval/model_completions.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>

#include "slm/engine/generation.h"
#include "slm/io/run_dir.h"
#include "slm/model/weights.h"
#include "slm/recipe/recipe.h"
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
  if (spec_.sampling.max_tokens < 1) throw Error("--max-tokens must be at least 1");
  const torch::Device device = parse_device(spec_.device);
  if (!spec_.checkpoint.empty()) {
    if (::access(spec_.checkpoint.c_str(), F_OK) != 0) throw Error(spec_.checkpoint + ": no such checkpoint");
    spec_.checkpoint = io::resolve_run_dir(spec_.checkpoint);
  }
  if (spec_.checkpoint.empty() && spec_.recipe.empty())
    throw Error("give a checkpoint (--model) or a recipe (--recipe)");
  const Recipe recipe = spec_.recipe.empty() ? checkpoint_recipe(spec_.checkpoint) : load_recipe(spec_.recipe);
  std::string tokenizer = spec_.tokenizer;
  if (tokenizer.empty() && !spec_.checkpoint.empty()) tokenizer = train::checkpoint_tokenizer(spec_.checkpoint);
  if (!tokenizer.empty() && tokenizer != "byte") tokenizer_ = data::Tokenizer::load(tokenizer);
  torch::manual_seed(spec_.sampling.seed);
  model_ = std::make_shared<model::HybridLM>(recipe, torch::TensorOptions().dtype(torch::kFloat).device(device));
  model_->eval();
  if (!spec_.checkpoint.empty()) model::load_weights(*model_, model::weights_path(spec_.checkpoint));
  start(spec_.checkpoint.empty() ? "RANDOM weights, seed " + std::to_string(spec_.sampling.seed)
                                 : model::weights_path(spec_.checkpoint),
        tokenizer_ ? tokenizer : std::string("byte-level"));
}

ModelCompletions::ModelCompletions(std::shared_ptr<model::HybridLM> model, std::optional<data::Tokenizer> tokenizer,
                                   ModelSpec spec)
    : spec_(std::move(spec)), model_(std::move(model)), tokenizer_(std::move(tokenizer)) {
  if (!model_) throw Error("no model");
  if (spec_.sampling.max_tokens < 1) throw Error("--max-tokens must be at least 1");
  start("weights given", tokenizer_ ? "given" : "byte-level");
}

ModelCompletions::~ModelCompletions() = default;

void ModelCompletions::start(const std::string& weights, const std::string& tokenizer_name) {
  if (spec_.slots < 1) throw Error("--slots must be at least 1 (got " + std::to_string(spec_.slots) + ")");
  const auto ids = text::text_ids(tokenizer(), model_->recipe().vocab_size, "");
  banned_ = ids.banned;
  eos_ = ids.eos;
  description_ = "model " + model_->recipe().name + " (" + weights + "), tokenizer " + tokenizer_name + ", " +
                 std::to_string(spec_.slots) + " sequences at once, " + describe_sampling(spec_.sampling);
}

engine::Engine& ModelCompletions::engine_for(int64_t context) {
  context = std::max<int64_t>(context, model_->recipe().seq_len);
  if (!engine_ || engine_->context_length() < context) {
    engine_.reset();  // its pool goes before the next one is allocated
    engine::DecodeEngineOptions o;
    o.banned_ids = banned_;
    o.slots = spec_.slots;
    o.max_queue = static_cast<size_t>(spec_.slots);  // complete() never has more requests out
    o.context_length = context;
    engine_ = engine::make_decode_engine(engine::EngineModel{model_}, o);
  }
  return *engine_;
}

void ModelCompletions::complete(const std::vector<Problem>& problems, int n, const DeliverFn& deliver) {
  std::vector<std::vector<int64_t>> prompts;
  int64_t longest = 0;
  for (const auto& p : problems) {
    prompts.push_back(text::text_ids(tokenizer(), model_->recipe().vocab_size,
                                       prompt_tail(p.prompt, spec_.sampling.max_prompt_bytes))
                          .prompt);
    longest = std::max(longest, static_cast<int64_t>(prompts.back().size()));
  }
  engine::Engine& eng = engine_for(longest + spec_.sampling.max_tokens);
  complete_concurrently(
      problems, n, spec_.slots,
      [&](size_t pi, int j) {
        return Completion{generate(eng, prompts[pi], problems[pi], j), ""};
      },
      deliver);
}

std::string ModelCompletions::generate(engine::Engine& eng, const std::vector<int64_t>& prompt, const Problem& problem,
                                       int j) {
  // The engine's thread appends the text and ends the request once it holds a stop sequence (as generate_text
  // stops); this thread waits for the end.
  struct Wait {
    explicit Wait(text::TextOutput o) : out(std::move(o)) {}
    std::mutex mu;
    std::condition_variable cv;
    text::TextOutput out;
    std::string text;
    std::optional<engine::Result> result;
  };
  auto w = std::make_shared<Wait>(text::TextOutput(tokenizer(), problem.stop_tokens));
  auto id = std::make_shared<std::atomic<engine::RequestId>>(0);
  auto submitted = std::make_shared<std::atomic<bool>>(false);
  engine::Callbacks cb;
  cb.on_token = [w, &eng, id, submitted](int64_t token) {
    bool stop;
    {
      std::lock_guard lock(w->mu);
      if (w->out.stopped()) return;
      w->text += w->out.push(token);
      stop = w->out.stopped();
    }
    if (stop && submitted->load()) eng.cancel(id->load());  // else submit's caller cancels it
  };
  cb.on_done = [w](const engine::Result& r) {
    std::lock_guard lock(w->mu);
    w->text += w->out.flush();
    w->result = r;
    w->cv.notify_all();
  };
  engine::Request r;
  r.prompt = prompt;
  const auto& s = spec_.sampling;
  r.sampling = {s.temperature, s.top_p, s.top_k, sample_seed(s.seed, problem, j)};
  r.max_tokens = s.max_tokens;
  r.stop_ids = {eos_};
  id->store(eng.submit(std::move(r), std::move(cb)));
  submitted->store(true);
  std::unique_lock lock(w->mu);
  if (w->out.stopped() && !w->result) {
    lock.unlock();
    eng.cancel(id->load());
    lock.lock();
  }
  w->cv.wait(lock, [&] { return w->result.has_value(); });
  if (w->result->finish == engine::Finish::kError)
    throw Error(problem.name + ": generation failed: " + w->result->error);
  return w->text;
}

}  // namespace slm::eval
