#include "slm/engine/generation.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "slm/data/byte_tokenizer.h"
#include "slm/data/detokenizer.h"
#include "slm/engine/graph_decoder.h"
#include "slm/util/error.h"

namespace slm::engine {

namespace {

// Whether text, which grew by `added` bytes since the last call, now holds a stop text (only the part a new
// occurrence can overlap is searched).
bool reached_stop(const std::string& text, size_t added, const std::vector<std::string>& stops) {
  for (const auto& s : stops) {
    if (s.empty()) continue;
    const size_t from = text.size() - std::min(text.size(), added + s.size() - 1);
    if (text.find(s, from) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

namespace {

// One member of a generation: its model, state and (where allowed) the CUDA graph of its decode step.
struct Runner {
  model::HybridLM* model;
  double weight;
  model::DecodeState state;
  std::unique_ptr<GraphDecoder> graph;
  torch::Tensor step(const torch::Tensor& token) { return graph ? graph->step(token) : model->decode(token, state); }
};

// The members' next-token distributions mixed by weight, as log-probabilities [1, V] on the first member's device
// (a single member's logits pass through unchanged).
torch::Tensor mix(const std::vector<Runner>& runners, const std::vector<torch::Tensor>& logits) {
  if (runners.size() == 1) return logits[0];
  const auto device = logits[0].device();
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < runners.size(); ++i)
    parts.push_back(torch::log_softmax(logits[i].to(device, torch::kFloat), -1) + std::log(runners[i].weight));
  return torch::logsumexp(torch::stack(parts), 0);
}

}  // namespace

std::vector<int64_t> generate_mixture(const std::vector<MixtureMember>& members, const std::vector<int64_t>& prompt,
                                      const GenerationOptions& o, const std::function<bool(int64_t)>& on_token,
                                      GenerationStats* stats) {
  if (members.empty()) throw Error("generate: no model");
  if (prompt.empty()) throw Error("generate: the prompt must hold at least one token");
  if (o.max_tokens < 1) throw Error("generate: max_tokens must be at least 1");
  const auto vocab = members[0].model->recipe().vocab_size;
  for (const auto& m : members) {
    if (m.model->recipe().vocab_size != vocab)
      throw Error("generate: a mixture needs one vocabulary; " + m.model->recipe().name + " has " +
                  std::to_string(m.model->recipe().vocab_size) + " ids, " + members[0].model->recipe().name + " " +
                  std::to_string(vocab));
    if (!(m.weight > 0) || !std::isfinite(m.weight))
      throw Error("generate: mixture weights must be positive, got " + std::to_string(m.weight));
  }
  for (int64_t id : prompt)
    if (id < 0 || id >= vocab)
      throw Error("generate: prompt token " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(vocab));
  torch::NoGradGuard no_grad;
  const auto device = members[0].model->embed->weight.device();
  model::Sampler sampler(o.sampling);
  const auto n = static_cast<int64_t>(prompt.size());
  GenerationStats timing;
  timing.prompt_tokens = n;
  auto start = std::chrono::steady_clock::now();
  // Seconds since start, restarting the clock.
  auto lap = [&start] {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - start).count();
    start = now;
    return s;
  };
  double total_weight = 0;
  for (const auto& m : members) total_weight += m.weight;
  std::vector<Runner> runners;
  runners.reserve(members.size());  // a GraphDecoder keeps a reference to its runner's state: no reallocation
  std::vector<torch::Tensor> logits;
  const auto ids = torch::tensor(prompt, torch::kLong).unsqueeze(0);
  timing.graph = true;
  for (const auto& m : members) {
    auto& r =
        runners.emplace_back(Runner{m.model, m.weight / total_weight, m.model->new_state(1, n + o.max_tokens), {}});
    logits.push_back(r.model->prefill_last(ids.to(r.model->embed->weight.device()), r.state));
    if (o.cuda_graph && o.max_tokens > 1 && graph_decode_blocker(*r.model, r.state).empty())
      r.graph = std::make_unique<GraphDecoder>(*r.model, r.state);
    timing.graph = timing.graph && r.graph != nullptr;
  }
  torch::Tensor banned = o.banned.defined() ? o.banned.to(device) : torch::Tensor();
  std::vector<int64_t> out;
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    auto scores = mix(runners, logits);
    if (banned.defined()) scores = scores.masked_fill(banned, -std::numeric_limits<float>::infinity());
    auto next = sampler.sample(scores);
    const int64_t id = next.item<int64_t>();  // waits for the device: the step's time is all in
    (i == 0 ? timing.prefill_s : timing.decode_s) += lap();
    out.push_back(id);
    if ((on_token && !on_token(id)) || id == o.stop_id) break;
    if (i + 1 < o.max_tokens) {
      lap();  // the callback's time is not the model's
      for (size_t r = 0; r < runners.size(); ++r)
        logits[r] = runners[r].step(next.to(runners[r].model->embed->weight.device()));
      ++timing.decode_steps;
    }
  }
  if (stats) *stats = timing;
  return out;
}

std::vector<int64_t> generate(model::HybridLM& model, const std::vector<int64_t>& prompt, const GenerationOptions& o,
                              const std::function<bool(int64_t)>& on_token, GenerationStats* stats) {
  return generate_mixture({{&model, 1.0}}, prompt, o, on_token, stats);
}

TextIds text_ids(const data::Tokenizer* tok, int64_t vocab, const std::string& prompt) {
  TextIds t;
  if (!tok) {
    if (vocab < data::ByteTokenizer::kVocabSize)
      throw Error("generate: vocab_size " + std::to_string(vocab) + " is smaller than the byte tokenizer's " +
                  std::to_string(data::ByteTokenizer::kVocabSize) + " ids");
    const auto ids = data::ByteTokenizer().encode(prompt, /*add_bos=*/true);
    t.prompt.assign(ids.begin(), ids.end());
    t.eos = data::ByteTokenizer::kEos;
    for (int64_t id = 256; id < vocab; ++id)
      if (id != t.eos) t.banned.push_back(id);
    return t;
  }
  if (static_cast<int64_t>(tok->vocab_size()) > vocab)
    throw Error("generate: the tokenizer's " + std::to_string(tok->vocab_size()) +
                " ids do not fit the recipe's vocabulary of " + std::to_string(vocab));
  t.prompt = {static_cast<int64_t>(tok->bos_id())};
  for (uint32_t id : tok->encode(prompt)) t.prompt.push_back(id);
  t.eos = tok->eos_id();
  for (int64_t id = 0; id < vocab; ++id)
    if (id >= static_cast<int64_t>(tok->vocab_size()) || (tok->is_special(static_cast<uint32_t>(id)) && id != t.eos))
      t.banned.push_back(id);
  return t;
}

TextOutput::TextOutput(const data::Tokenizer* tokenizer, std::vector<std::string> stops) : stops_(std::move(stops)) {
  if (tokenizer) detok_.emplace(*tokenizer);
}

std::string TextOutput::push(int64_t id) {
  std::string piece = detok_ ? detok_->push(static_cast<uint32_t>(id))
                             : (id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string());
  text_ += piece;
  stopped_ = stopped_ || reached_stop(text_, piece.size(), stops_);
  return piece;
}

std::string TextOutput::flush() {
  return detok_ ? detok_->flush() : "";
}

namespace {

// generate() over text: the options' banned ids and stop id from text_ids, ending once `out` has stopped.
std::vector<int64_t> generate_over_text(model::HybridLM& model, const TextIds& t, GenerationOptions o, int64_t stop_id,
                                        TextOutput& out, const std::function<void(int64_t, const std::string&)>& seen,
                                        GenerationStats* stats) {
  o.banned = torch::zeros({model.recipe().vocab_size}, torch::kBool);
  for (int64_t id : t.banned) o.banned[id] = true;
  o.stop_id = stop_id;
  return generate(
      model, t.prompt, o,
      [&](int64_t id) {
        seen(id, out.push(id));
        return !out.stopped();
      },
      stats);
}

}  // namespace

std::vector<int64_t> generate_text(model::HybridLM& model, const data::Tokenizer& tok, const std::string& prompt,
                                   GenerationOptions o, const std::function<void(const std::string&)>& on_text,
                                   GenerationStats* stats) {
  const TextIds t = text_ids(&tok, model.recipe().vocab_size, prompt);
  TextOutput out(&tok, o.stop_texts);
  auto ids = generate_over_text(
      model, t, o, t.eos, out,
      [&](int64_t, const std::string& piece) {
        if (on_text && !piece.empty()) on_text(piece);
      },
      stats);
  if (std::string rest = out.flush(); on_text && !rest.empty()) on_text(rest);
  return ids;
}

std::vector<int64_t> generate_byte_text(model::HybridLM& model, const std::string& prompt, GenerationOptions o,
                                        bool stop_at_eos, const std::function<void(int64_t)>& on_id,
                                        GenerationStats* stats) {
  const TextIds t = text_ids(nullptr, model.recipe().vocab_size, prompt);
  TextOutput out(nullptr, o.stop_texts);
  return generate_over_text(
      model, t, o, stop_at_eos ? t.eos : -1, out,
      [&](int64_t id, const std::string&) {
        if (on_id) on_id(id);
      },
      stats);
}

}  // namespace slm::engine
