#include "slm/engine/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "slm/engine/graph_decoder.h"
#include "slm/util/error.h"

namespace slm::engine {


namespace {

// Seconds between calls of lap() (the first: since construction).
class Stopwatch {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - start_).count();
    start_ = now;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

void check_request(const std::vector<int64_t>& prompt, int64_t vocab, const GenerationOptions& o) {
  if (prompt.empty()) throw Error("generate: the prompt must hold at least one token");
  if (o.max_tokens < 1) throw Error("generate: max_tokens must be at least 1");
  for (int64_t id : prompt)
    if (id < 0 || id >= vocab)
      throw Error("generate: prompt token " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(vocab));
}

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
  if (o.speculative != 0) throw Error("generate: speculative decoding runs one model, not a mixture");
  const auto vocab = members[0].model->recipe().vocab_size;
  for (const auto& m : members) {
    if (m.model->recipe().vocab_size != vocab)
      throw Error("generate: a mixture needs one vocabulary; " + m.model->recipe().name + " has " +
                  std::to_string(m.model->recipe().vocab_size) + " ids, " + members[0].model->recipe().name + " " +
                  std::to_string(vocab));
    if (!(m.weight > 0) || !std::isfinite(m.weight))
      throw Error("generate: mixture weights must be positive, got " + std::to_string(m.weight));
  }
  check_request(prompt, vocab, o);
  torch::NoGradGuard no_grad;
  const auto device = members[0].model->embed->weight.device();
  model::Sampler sampler(o.sampling);
  sampler.set_prompt(prompt);
  const auto n = static_cast<int64_t>(prompt.size());
  GenerationStats timing;
  timing.prompt_tokens = n;
  Stopwatch clock;
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
    (i == 0 ? timing.prefill_s : timing.decode_s) += clock.lap();
    out.push_back(id);
    if ((on_token && !on_token(id)) || id == o.stop_id) break;
    if (i + 1 < o.max_tokens) {
      clock.lap();  // the callback's time is not the model's
      for (size_t r = 0; r < runners.size(); ++r)
        logits[r] = runners[r].step(next.to(runners[r].model->embed->weight.device()));
      ++timing.decode_steps;
    }
  }
  if (stats) *stats = timing;
  return out;
}

namespace {

// generate() with GenerationOptions::speculative > 0. Each round: the next token t0 from the last logits (drawn
// without a draft just turned down), drafts d1..dk from the MTP modules after t0, one prefill of [t0, d1..dk] whose
// logits judge d1..dk in turn, the kept ones emitted, the state rolled back over the others (counters only), and
// the logits after the last kept token carried into the next round.
std::vector<int64_t> generate_speculative(model::HybridLM& model, const std::vector<int64_t>& prompt,
                                          const GenerationOptions& o, const std::function<bool(int64_t)>& on_token,
                                          GenerationStats* stats) {
  const int64_t depth = model.plan().mtp_depth;
  if (depth == 0)
    throw Error(model.recipe().source +
                ": speculative decoding drafts with the MTP modules, and the recipe has none (mtp.depth 0)");
  if (o.speculative < 0 || o.speculative > depth)
    throw Error("generate: " + std::to_string(o.speculative) + " speculative tokens: the recipe's " +
                std::to_string(depth) + " MTP module(s) draft 1.." + std::to_string(depth));
  check_request(prompt, model.recipe().vocab_size, o);
  if (o.sampling.penalized())
    throw Error(
        "generate: speculative decoding judges drafts by a fixed distribution; the penalties change it with "
        "every token (drop --speculative or the penalties)");
  torch::NoGradGuard no_grad;
  const auto device = model.embed->weight.device();
  model::Sampler sampler(o.sampling);
  const auto n = static_cast<int64_t>(prompt.size());
  GenerationStats timing;
  timing.prompt_tokens = n;
  Stopwatch clock;
  // A round pushes its drafts before they are judged, so the state rolls back over up to `speculative` tokens; it
  // never pushes past the last token it may emit, so the capacity is that of plain generation.
  auto state = model.new_state(1, n + o.max_tokens, o.speculative);
  auto logits = model.prefill_last(torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device), state);
  const torch::Tensor banned = o.banned.defined() ? o.banned.to(device) : torch::Tensor();
  auto mask = [&](const torch::Tensor& scores) {
    return banned.defined() ? scores.masked_fill(banned, -std::numeric_limits<float>::infinity()) : scores;
  };
  std::vector<int64_t> out;
  // Hands id out; false once generation is over (the callback said stop, the stop id, max_tokens), exactly where
  // plain generation would end.
  auto emit = [&](int64_t id) {
    (out.empty() ? timing.prefill_s : timing.decode_s) += clock.lap();
    out.push_back(id);
    const bool more = (!on_token || on_token(id)) && id != o.stop_id && static_cast<int64_t>(out.size()) < o.max_tokens;
    clock.lap();  // the callback's time is not the model's
    return more;
  };
  int64_t rejected = -1;  // the draft the main model just turned down, or -1
  for (;;) {
    int64_t next;
    if (sampler.greedy()) {
      next = mask(logits).argmax(-1).item<int64_t>();
    } else {
      // After a rejection: the residual (p - q)+ of a point-mass draft q, i.e. p without the draft, renormalised.
      auto p = sampler.probabilities(mask(logits));
      if (rejected >= 0) p[0][rejected] = 0.0;
      next = sampler.draw(p).item<int64_t>();
    }
    if (!emit(next)) break;
    const int64_t k = std::min(o.speculative, o.max_tokens - static_cast<int64_t>(out.size()));
    const auto t0 = torch::tensor({next}, torch::kLong).to(device);
    const auto drafts = model.draft(state, t0).narrow(1, 0, k);
    const auto verify = mask(model.prefill(torch::cat({t0.view({1, 1}), drafts}, 1), state).squeeze(0));  // [k+1, V]
    const auto guesses = drafts.squeeze(0).cpu();
    // Greedy: the main model's choices; sampling: its distributions, one row per judged position.
    // On the host once, so judging reads no device value per draft.
    const auto judge = (sampler.greedy() ? verify.argmax(-1) : sampler.probabilities(verify)).cpu();
    int64_t kept = 0;
    bool more = true;
    rejected = -1;
    for (; kept < k && more; ++kept) {
      const int64_t d = guesses[kept].item<int64_t>();
      ++timing.drafted;
      const bool keep =
          sampler.greedy() ? judge[kept].item<int64_t>() == d : sampler.uniform() < judge[kept][d].item<double>();
      if (!keep) {
        rejected = d;
        break;
      }
      ++timing.accepted;
      more = emit(d);
    }
    if (!more) break;
    state.rollback(k - kept);
    logits = verify.narrow(0, kept, 1);
  }
  timing.decode_steps = static_cast<int64_t>(out.size()) - 1;
  if (stats) *stats = timing;
  return out;
}

}  // namespace

std::vector<int64_t> generate(model::HybridLM& model, const std::vector<int64_t>& prompt, const GenerationOptions& o,
                              const std::function<bool(int64_t)>& on_token, GenerationStats* stats) {
  if (o.speculative != 0) return generate_speculative(model, prompt, o, on_token, stats);
  return generate_mixture({{&model, 1.0}}, prompt, o, on_token, stats);
}

}  // namespace slm::engine
