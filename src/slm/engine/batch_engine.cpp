#include "slm/engine/batch_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <optional>
#include <vector>

#include "slm/engine/graph_decoder.h"
#include "slm/engine/queued_engine.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/sampler.h"

namespace slm::engine {

std::string batch_decode_blocker(const model::HybridLM& m) { return m.decode_support().batched_rows; }

namespace {

// One request from its admission to its end.
struct Sequence {
  std::shared_ptr<Job> job;
  model::Sampler sampler;
  std::optional<model::DecodeState> prompt_state;  // while the prompt goes in: its own state, one row
  int64_t prefilled = 0;                           // prompt tokens in
  int64_t length = 0;                              // tokens in its pool row
  int64_t next = 0;                                // the token its next decode step consumes
  Result result;
  std::vector<int64_t> cache_points;  // Request::cache_points inside (0, prompt), sorted, once each; none: cache off
};

// A prompt's state kept for later prompts that start with the same tokens.
struct SavedPrefix {
  std::vector<int64_t> tokens;
  // Row `row` holds exactly `tokens`. Prompts that prefilled together share their batch's state (one row each)
  // rather than copying their rows out, so a batch's memory is freed with the last of its prefixes.
  std::shared_ptr<const model::DecodeState> state;
  int64_t row = 0;
  torch::Tensor logits;  // [1, V]: the next-token logits after them
  uint64_t used = 0;     // when it was last saved or restored (least recently used go first)
};

// A decode step of a run of leading rows: a view of the pool and, where allowed, the CUDA graph of a step on it.
struct Bucket {
  model::DecodeState rows;
  std::unique_ptr<GraphDecoder> graph;
};

class BatchEngine final : public QueuedEngine {
 public:
  BatchEngine(EngineModel model, DecodeEngineOptions o, int64_t vocab, int64_t context, PromptLogitsHook hook)
      : QueuedEngine(std::move(o), vocab, context, 1), model_(std::move(model)), on_prompt_logits_(std::move(hook)) {
    if (options_.slots < 1) throw Error("engine: slots must be at least 1");
    if (options_.prefill_chunk < 1) throw Error("engine: prefill_chunk must be at least 1");
    auto& m = *model_.model;
    device_ = m.embed->weight.device();
    banned_device_ = banned_.to(device_);
    {
      std::lock_guard turn(*model_.in_use);
      torch::NoGradGuard no_grad;
      pool_ = m.new_state(options_.slots, context_);
      // One step on the whole pool gives every recurrent buffer the dtype a step leaves (a zero state may differ);
      // afterwards the pool's buffers stay where they are, which the row views and CUDA graphs rely on.
      m.decode(torch::zeros({options_.slots}, torch::TensorOptions().dtype(torch::kLong).device(device_)), pool_);
      pool_.shift_length(-pool_.length);
    }
    graphs_ = options_.cuda_graph && graph_decode_blocker(m, pool_).empty();
    if (graphs_) {
      // Every bucket's graph now: a size first met while requests wait took its capture (~0.15 s for hybrid-250m on
      // an H200) out of their first tokens (bench/RESULTS.md). Capture runs no kernels; the pool stays as it is.
      std::lock_guard turn(*model_.in_use);
      for (int64_t size = 1;; size *= 2) {
        bucket(std::min(size, options_.slots));
        if (size >= options_.slots) break;
      }
    }
    start();
  }
  ~BatchEngine() override { stop(); }

 private:
  void work() override {
    std::vector<std::shared_ptr<Job>> taken;
    const auto slots = static_cast<size_t>(options_.slots);
    while (take(slots - rows_.size() - prefilling_.size(), !rows_.empty() || !prefilling_.empty(), taken)) {
      for (auto& job : taken) {
        Sequence q{job, model::Sampler(sampler_options(job->request.sampling)), std::nullopt, 0, 0, 0, {}, {}};
        q.sampler.set_prompt(job->request.prompt);
        q.result.prompt_tokens = static_cast<int64_t>(job->request.prompt.size());
        if (options_.prefix_cache_bytes > 0) {  // without a cache a point would only split the prefill for nothing
          auto& c = q.cache_points;
          for (int64_t k : job->request.cache_points)
            if (k > 0 && k < q.result.prompt_tokens) c.push_back(k);  // the prompt's end is saved anyway
          std::sort(c.begin(), c.end());
          c.erase(std::unique(c.begin(), c.end()), c.end());
        }
        prefilling_.push_back(std::move(q));
      }
      taken.clear();
      drop_cancelled();
      if (!prefilling_.empty()) prefill_chunk();
      if (!rows_.empty()) decode_step();
    }
  }

  // Ends q with result.finish = f (and error).
  void end(Sequence& q, Finish f, const std::string& error = "") {
    q.result.finish = f;
    q.result.error = error;
    finish(q.job, q.result);
  }

  // Hands id to q's client. Returns false when q has ended (cancelled, a stop id, max_tokens reached).
  bool deliver(Sequence& q, int64_t id) {
    const Request& r = q.job->request;
    if (q.job->cancelled) {
      end(q, Finish::kCancelled);
      return false;
    }
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end()) {
      end(q, Finish::kStop);
      return false;
    }
    ++q.result.completion_tokens;
    if (q.job->callbacks.on_token) q.job->callbacks.on_token(id);
    if (q.result.completion_tokens == r.max_tokens) {
      end(q, Finish::kLength);
      return false;
    }
    return true;
  }

  // Row r leaves the pool: the last running row moves into it.
  void remove_row(size_t r) {
    const size_t last = rows_.size() - 1;
    if (r != last) {
      pool_.copy_row(pool_, static_cast<int64_t>(last), static_cast<int64_t>(r), rows_[last].length);
      rows_[r] = std::move(rows_[last]);
    }
    rows_.pop_back();
  }

  void drop_cancelled() {
    for (size_t i = prefilling_.size(); i-- > 0;)
      if (prefilling_[i].job->cancelled) {
        end(prefilling_[i], Finish::kCancelled);
        prefilling_.erase(prefilling_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    for (size_t r = rows_.size(); r-- > 0;)
      if (rows_[r].job->cancelled) {
        end(rows_[r], Finish::kCancelled);
        remove_row(r);
      }
  }

  // The longest saved prefix of prompt, or null.
  SavedPrefix* longest_saved(const std::vector<int64_t>& prompt) {
    SavedPrefix* best = nullptr;
    for (auto& s : saved_)
      if (s.tokens.size() <= prompt.size() && (!best || s.tokens.size() > best->tokens.size()) &&
          std::equal(s.tokens.begin(), s.tokens.end(), prompt.begin()))
        best = &s;
    return best;
  }

  // The longest saved prefix of q's prompt restored into q's new prompt state; returns its logits when it is the
  // whole prompt.
  torch::Tensor restore_prefix(Sequence& q) {
    const auto& prompt = q.job->request.prompt;
    SavedPrefix* best = longest_saved(prompt);
    if (!best) return {};
    const auto k = static_cast<int64_t>(best->tokens.size());
    q.prompt_state->copy_row(*best->state, best->row, 0, k);
    q.prompt_state->shift_length(k);
    q.prefilled = k;
    best->used = ++clock_;
    reused_prompt_tokens_ += k;  // counted once the state is in place
    q.result.cached_tokens = k;
    return k == static_cast<int64_t>(prompt.size()) ? best->logits : torch::Tensor();
  }

  // Whether q's state after its first q.prefilled prompt tokens should be saved: the cache is on and the prefix is
  // not saved already (a saved one counts as used now).
  bool prefix_wanted(const Sequence& q) {
    const int64_t k = q.prefilled;
    if (options_.prefix_cache_bytes <= 0) return false;
    const auto& prompt = q.job->request.prompt;
    for (auto& s : saved_)
      if (static_cast<int64_t>(s.tokens.size()) == k && std::equal(s.tokens.begin(), s.tokens.end(), prompt.begin())) {
        s.used = ++clock_;
        return false;
      }
    return true;
  }

  // The memory the saved prefixes keep alive: each state (a batch of first chunks shares one) and logits once.
  int64_t saved_bytes() const {
    std::vector<torch::Tensor> held;
    for (const auto& s : saved_) {
      s.state->collect_tensors(held);
      held.push_back(s.logits);
    }
    return model::distinct_storage_bytes(held);
  }

  // Saves that state (prefix_wanted said so): row `row` of `state`, which stays as it is from now on, held by
  // pointer (a batch of first chunks shares one); logits: what follows the prefix, a prefill's own output that nothing
  // writes later. The least recently used prefixes make room; a state larger than the whole budget is not kept.
  void keep_prefix(const Sequence& q, std::shared_ptr<const model::DecodeState> state, int64_t row,
                   const torch::Tensor& logits) {
    if (model::distinct_storage_bytes({logits}) + state->bytes() > options_.prefix_cache_bytes) return;
    const int64_t k = q.prefilled;
    const auto& prompt = q.job->request.prompt;
    saved_.push_back(
        {std::vector<int64_t>(prompt.begin(), prompt.begin() + k), std::move(state), row, logits, ++clock_});
    while (saved_bytes() > options_.prefix_cache_bytes)  // the new prefix is the most recently used: it stays
      saved_.erase(std::min_element(saved_.begin(), saved_.end(),
                                    [](const SavedPrefix& a, const SavedPrefix& b) { return a.used < b.used; }));
  }

  // The same for a state that goes on (a prompt's own, one row): its first q.prefilled tokens copied out.
  void save_prefix_copy(const Sequence& q, const model::DecodeState& state, const torch::Tensor& logits) {
    if (!prefix_wanted(q)) return;
    const int64_t k = q.prefilled;
    auto own = std::make_shared<model::DecodeState>(model_.model->new_state(1, k));
    own->copy_row(state, 0, 0, k);
    own->shift_length(k);
    keep_prefix(q, std::move(own), 0, logits);
  }

  // Where q's next chunk ends: at the next of its boundaries after q.prefilled, which are the multiples of
  // prefill_chunk, its cache points and its end. The state is saved at each of them.
  int64_t chunk_end(const Sequence& q) const {
    const auto n = static_cast<int64_t>(q.job->request.prompt.size());
    const int64_t end = std::min(n, (q.prefilled / options_.prefill_chunk + 1) * options_.prefill_chunk);
    const auto point = std::upper_bound(q.cache_points.begin(), q.cache_points.end(), q.prefilled);
    return point == q.cache_points.end() ? end : std::min(end, *point);
  }

  // The prompt's next-token logits to the test hook, if any.
  void report_logits(const Sequence& q, const torch::Tensor& logits) {
    if (on_prompt_logits_) on_prompt_logits_(q.job->id, logits);
  }

  // The next chunk of the oldest prompt; once it is all in, the first token and a row in the pool. A prompt starts
  // from the longest saved state of its first tokens, then runs chunk by chunk to its boundaries (chunk_end). So a
  // prompt restored at k runs from k on exactly the chunks it would run without the cache, and starts from the
  // state that run reaches at k, when k and the boundaries below k of the prompt that saved the state are among its
  // own (the same prompt again; an editor's next keystroke with the same cache points); otherwise only the split
  // of its prefill differs, which changes the result by float rounding alone.
  void prefill_chunk() {
    if (prefill_first_chunks()) return;
    auto& m = *model_.model;
    Sequence& q = prefilling_.front();
    const auto& prompt = q.job->request.prompt;
    const auto n = static_cast<int64_t>(prompt.size());
    int64_t id = 0;
    try {
      std::lock_guard turn(*model_.in_use);
      torch::NoGradGuard no_grad;
      torch::Tensor logits;
      if (!q.prompt_state) {
        q.prompt_state = m.new_state(1, n);
        if (options_.prefix_cache_bytes > 0) logits = restore_prefix(q);
      }
      if (!logits.defined()) {
        const int64_t end = chunk_end(q);
        const auto ids =
            torch::tensor(std::vector<int64_t>(prompt.begin() + q.prefilled, prompt.begin() + end), torch::kLong)
                .unsqueeze(0)
                .to(device_);
        logits = m.prefill_last(ids, *q.prompt_state);
        q.prefilled = end;
        save_prefix_copy(q, *q.prompt_state, logits);
      }
      if (q.prefilled < n) return;
      report_logits(q, logits);
      id =
          q.sampler.sample(logits.masked_fill(banned_device_, -std::numeric_limits<float>::infinity())).item<int64_t>();
      if (q.job->request.max_tokens > 1 && !q.job->cancelled) {
        pool_.copy_row(*q.prompt_state, 0, static_cast<int64_t>(rows_.size()), n);
        q.length = n;
      }
    } catch (const std::exception& e) {
      end(q, Finish::kError, e.what());
      prefilling_.pop_front();
      return;
    }
    q.prompt_state.reset();
    q.next = id;
    if (deliver(q, id)) rows_.push_back(std::move(q));
    prefilling_.pop_front();
  }

  // Prompts that have not started (no state, no saved prefix) and whose first chunk is as long as the oldest one's
  // run that chunk in one forward of [prompts, chunk] tokens instead of one forward each: equal lengths, because
  // padding would run the recurrent layers past a shorter prompt's end. A prompt that fits in the chunk takes its
  // first token and its pool row from it at once; a longer one keeps its row of the batch as its own state and
  // continues chunk by chunk. The first chunk ends at the prompt's first boundary (chunk_end), a cache point inside
  // it included, whose state is saved as a row of the batch like any other. Returns false (nothing done) when fewer
  // than two prompts qualify.
  bool prefill_first_chunks() {
    auto first_chunk = [&](const Sequence& q) -> int64_t {
      if (q.prompt_state || (options_.prefix_cache_bytes > 0 && longest_saved(q.job->request.prompt))) return 0;
      return chunk_end(q);
    };
    const int64_t chunk = first_chunk(prefilling_.front());
    std::vector<size_t> group;
    for (size_t i = 0; chunk > 0 && i < prefilling_.size(); ++i)
      if (first_chunk(prefilling_[i]) == chunk) group.push_back(i);
    if (group.size() < 2) return false;
    auto& m = *model_.model;
    const auto g = static_cast<int64_t>(group.size());
    std::vector<char> done(prefilling_.size(), 0);         // left the prefill queue (finished or failed)
    std::vector<std::pair<size_t, int64_t>> first_tokens;  // prompt index, sampled id
    try {
      std::lock_guard turn(*model_.in_use);
      torch::NoGradGuard no_grad;
      std::vector<int64_t> ids;
      ids.reserve(static_cast<size_t>(g * chunk));
      for (size_t i : group) {
        const auto& prompt = prefilling_[i].job->request.prompt;
        ids.insert(ids.end(), prompt.begin(), prompt.begin() + chunk);
      }
      auto batch = std::make_shared<model::DecodeState>(m.new_state(g, chunk));
      const auto logits =
          m.prefill_last(torch::tensor(ids, torch::kLong).view({g, chunk}).to(device_), *batch);  // [g, V]
      std::vector<int64_t> ending;  // rows of the batch whose prompt ends with the chunk
      std::vector<model::Sampler*> samplers;
      for (int64_t r = 0; r < g; ++r) {
        Sequence& q = prefilling_[group[static_cast<size_t>(r)]];
        const auto n = static_cast<int64_t>(q.job->request.prompt.size());
        q.prefilled = chunk;
        if (prefix_wanted(q)) keep_prefix(q, batch, r, logits.narrow(0, r, 1));
        if (chunk < n) {
          q.prompt_state = m.new_state(1, n);
          q.prompt_state->copy_row(*batch, r, 0, chunk);
          q.prompt_state->shift_length(chunk);
          continue;
        }
        ending.push_back(r);
        samplers.push_back(&q.sampler);
        report_logits(q, logits.narrow(0, r, 1));
      }
      if (!ending.empty()) {
        // The ending rows take the pool rows after the running ones, in order: one copy per buffer for each run of
        // consecutive batch rows (one run when every prompt ended), and their first tokens in one sampling pass.
        const int64_t base = static_cast<int64_t>(rows_.size()), count = static_cast<int64_t>(ending.size());
        for (int64_t j = 0, run = 1; j < count; j += run) {
          run = 1;
          while (j + run < count && ending[static_cast<size_t>(j + run)] == ending[static_cast<size_t>(j)] + run) ++run;
          pool_.copy_rows(*batch, ending[static_cast<size_t>(j)], base + j, run, chunk);
        }
        const auto rows = count == g ? logits : logits.index_select(0, torch::tensor(ending).to(device_));
        const auto first = model::Sampler::sample_rows(
            samplers, rows.masked_fill(banned_device_, -std::numeric_limits<float>::infinity()));
        for (int64_t j = 0; j < count; ++j) {
          const size_t i = group[static_cast<size_t>(ending[static_cast<size_t>(j)])];
          prefilling_[i].length = chunk;
          first_tokens.emplace_back(i, first[static_cast<size_t>(j)]);
        }
      }
      batched_prompts_ += g;
    } catch (const std::exception& e) {
      for (size_t i : group) {
        end(prefilling_[i], Finish::kError, e.what());
        done[i] = 1;
      }
      first_tokens.clear();
    }
    // The finished prompts take the rows their states were copied into, in order; then each gets its first token,
    // and one that it ends (max_tokens 1, cancelled) gives its row back (the last row moves in, as after a decode
    // step).
    const size_t base = rows_.size();
    for (auto& [i, id] : first_tokens) {
      prefilling_[i].next = id;
      done[i] = 1;
      rows_.push_back(std::move(prefilling_[i]));
    }
    for (size_t r = rows_.size(); r-- > base;)
      if (!deliver(rows_[r], rows_[r].next)) remove_row(r);
    for (size_t i = prefilling_.size(); i-- > 0;)
      if (done[i]) prefilling_.erase(prefilling_.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  }

  // The leading rows' view (all running rows, rounded up to a power of two when steps replay graphs).
  Bucket& bucket(int64_t running) {
    int64_t size = running;
    if (graphs_) {
      size = 1;
      while (size < running) size *= 2;
      size = std::min(size, options_.slots);
    }
    auto& b = buckets_[size];
    if (!b) {
      b = std::make_unique<Bucket>(Bucket{pool_.view_rows(0, size), nullptr});
      if (graphs_) b->graph = std::make_unique<GraphDecoder>(*model_.model, b->rows);
    }
    return *b;
  }

  // One token for every running row.
  void decode_step() {
    auto& m = *model_.model;
    const auto running = static_cast<int64_t>(rows_.size());
    std::vector<int64_t> ids;
    try {
      std::lock_guard turn(*model_.in_use);
      torch::NoGradGuard no_grad;
      Bucket& b = bucket(running);
      const int64_t size = b.rows.batch();
      // Rows past the running ones (a graph's bucket) step too, at position 0 of a free row, and are ignored.
      std::vector<int64_t> lengths(static_cast<size_t>(size), 0), tokens(static_cast<size_t>(size), 0);
      for (int64_t r = 0; r < running; ++r) {
        lengths[static_cast<size_t>(r)] = rows_[static_cast<size_t>(r)].length;
        tokens[static_cast<size_t>(r)] = rows_[static_cast<size_t>(r)].next;
      }
      b.rows.positions.copy_(torch::tensor(lengths, torch::kLong));
      // The host's counters mean nothing in a pool (every row has its own length on the device); zero keeps the
      // capacity checks, which the lengths already passed at submit, from tripping.
      b.rows.shift_length(-b.rows.length);
      const auto token = torch::tensor(tokens, torch::kLong).to(device_);
      auto logits = (b.graph ? b.graph->step(token) : m.decode(token, b.rows)).narrow(0, 0, running);
      logits = logits.masked_fill(banned_device_, -std::numeric_limits<float>::infinity());
      ids = sample(logits);
    } catch (const std::exception& e) {
      for (auto& q : rows_) end(q, Finish::kError, e.what());
      rows_.clear();
      return;
    }
    for (size_t r = rows_.size(); r-- > 0;) {
      auto& q = rows_[r];
      ++q.length;
      q.next = ids[r];
      if (!deliver(q, ids[r])) remove_row(r);
    }
  }

  // Each row's next token by its own sampler, all rows in one pass on the device and one read of the ids.
  std::vector<int64_t> sample(const torch::Tensor& logits) {
    std::vector<model::Sampler*> samplers;
    for (auto& q : rows_) samplers.push_back(&q.sampler);
    return model::Sampler::sample_rows(samplers, logits);
  }

  EngineModel model_;
  const PromptLogitsHook on_prompt_logits_;
  torch::Device device_{torch::kCPU};
  torch::Tensor banned_device_;
  model::DecodeState pool_;
  bool graphs_ = false;
  std::map<int64_t, std::unique_ptr<Bucket>> buckets_;
  std::list<SavedPrefix> saved_;
  uint64_t clock_ = 0;
  std::deque<Sequence> prefilling_;
  std::vector<Sequence> rows_;  // rows_[r] runs in row r of the pool
};

}  // namespace

std::unique_ptr<Engine> make_batch_engine(EngineModel model, DecodeEngineOptions options,
                                          PromptLogitsHook on_prompt_logits) {
  if (!model.model) throw Error("engine: no model");
  if (const std::string why = batch_decode_blocker(*model.model); !why.empty())
    throw Error("continuous batching: " + why);
  const auto [vocab, context] = vocab_and_context({model}, options);
  return std::make_unique<BatchEngine>(std::move(model), std::move(options), vocab, context,
                                       std::move(on_prompt_logits));
}

}  // namespace slm::engine
