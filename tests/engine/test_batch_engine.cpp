// Continuous batching (engine/batch_engine.h) against the model's own one-sequence loop: every request, among others
// that join and leave at other times, gets exactly the tokens it gets alone; and the pooled state's row primitives.
#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>

#include "engine/engine_test_util.h"
#include "slm/engine/batch_engine.h"
#include "slm/engine/decode_engine.h"
#include "slm/engine/generation.h"
#include "slm/engine/graph_decoder.h"

namespace slm::engine {
namespace {

// Every family the batch engine runs at toy width: windowed and global attention, Mamba-3 (MIMO), routed + shared
// experts, M2RNN, dense MLP, Engram, mHC and an MTP module (tiny-full without its MLA and DSA layers).
nlohmann::json hybrid_json(bool mla = false) {
  std::ifstream file(test::source_path("recipes/tiny-full.json"));
  auto j = nlohmann::json::parse(file);
  j["seq_len"] = 256;
  j["pattern"] = "AEMFAEMR";
  j["depth"] = 8;
  j["attention"]["dsa_enabled"] = false;
  if (mla) {
    j["attention"]["mla_layers"] = {0, 4};
  } else {
    j["attention"].erase("mla_layers");
    j["attention"].erase("mla");
    j["mtp"]["mla"] = false;
  }
  j["engram"]["layers"] = {0, 4};
  j["mhc"]["layers"] = {0, 1, 2, 3};
  return j;
}

std::shared_ptr<model::HybridLM> hybrid_model(uint64_t seed, const nlohmann::json& j = hybrid_json(),
                                              torch::Device device = torch::kCPU) {
  auto m = std::make_shared<model::HybridLM>(parse_recipe_text(j.dump(), "batch-hybrid.json"),
                                             torch::TensorOptions().device(device));
  test::randomize(*m, seed);
  m->eval();
  return m;
}

using Sink = test::TokenSink;

std::vector<int64_t> prompt_of(int64_t length, uint64_t seed) {
  auto t = test::random_tokens(1, length, 500, seed);
  std::vector<int64_t> p(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + length);
  p[0] = 2;
  return p;
}

// With DSA too (layer 4: its decode step selects keys over the whole capacity at each row's own position).
TEST(BatchEngine, EachOfSixteenRequestsGetsItsTokensAlone) {
  test::single_threaded();
  for (bool dsa : {false, true}) {
    auto j = hybrid_json();
    j["attention"]["dsa_enabled"] = dsa;
    auto m = hybrid_model(11, j);
    ASSERT_EQ(batch_decode_blocker(*m), "");
    // Prompts of 3..33 tokens, 2..24 new tokens: rows join and leave at different steps, so finished rows are
    // replaced by moved ones, and 5-token chunks put decode steps between the chunks of the longer prompts.
    std::vector<std::vector<int64_t>> prompts;
    std::vector<int64_t> max_tokens;
    std::vector<std::vector<int64_t>> expected;
    for (int i = 0; i < 16; ++i) {
      prompts.push_back(prompt_of(3 + (i * 7) % 31, 100 + i));
      max_tokens.push_back(2 + (i * 5) % 23);
      expected.push_back(test::greedy_reference(*m, prompts.back(), max_tokens.back(), {}, {}));
    }
    DecodeEngineOptions o;
    o.slots = 6;  // fewer slots than requests: the rest wait and join as rows free up
    o.prefill_chunk = 5;
    o.max_queue = 16;
    auto eng = make_batch_engine({m}, o);
    std::vector<Sink> sinks(16);
    for (int i = 0; i < 16; ++i)
      eng->submit({prompts[i], {0.0, 1.0, 0, 0}, max_tokens[i], {}, {}}, sinks[i].callbacks());
    for (int i = 0; i < 16; ++i) {
      const auto r = sinks[i].wait();
      EXPECT_EQ(r.finish, Finish::kLength) << "dsa " << dsa << " request " << i << ": " << r.error;
      EXPECT_EQ(sinks[i].tokens, expected[i]) << "dsa " << dsa << " request " << i;
      EXPECT_EQ(r.completion_tokens, max_tokens[i]);
    }
    EXPECT_EQ(eng->stats().running, 0);
  }
}

// Prompts waiting together whose first chunks are equally long run that chunk in one forward: those that fit in it
// take their first token and pool row from it, longer ones continue chunk by chunk from their row of it. Each still
// gets exactly the tokens it gets alone. The engine is held (its model lock) while the requests arrive, so they wait
// together. The 8- and 13-token prompts share a first chunk of 8 and interleave, so the rows that end there reach the
// pool as several runs of batch rows. Later prompts restore the prefixes the batches saved (rows of the shared batch
// state).
TEST(BatchEngine, EqualFirstChunksPrefillTogetherAndGetTheirTokensAlone) {
  test::single_threaded();
  auto m = hybrid_model(13);
  const std::vector<int64_t> lengths = {7, 7, 13, 7, 8, 7, 13, 8, 7, 8}, max_tokens = {1, 4, 5, 6, 3, 3, 4, 2, 2, 5};
  std::vector<std::vector<int64_t>> prompts, expected;
  for (size_t i = 0; i < lengths.size(); ++i) {
    prompts.push_back(prompt_of(lengths[i], 300 + i));
    expected.push_back(test::greedy_reference(*m, prompts.back(), max_tokens[i], {}, {}));
  }
  DecodeEngineOptions o;
  o.slots = 10;
  o.prefill_chunk = 8;  // 7- and 8-token prompts fit in one chunk; 13-token ones need two
  EngineModel em{m};
  auto eng = make_batch_engine(em, o);
  std::vector<Sink> sinks(prompts.size());
  {
    std::lock_guard hold(*em.in_use);
    for (size_t i = 0; i < prompts.size(); ++i)
      eng->submit({prompts[i], {0.0, 1.0, 0, 0}, max_tokens[i], {}, {}}, sinks[i].callbacks());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto r = sinks[i].wait();
    EXPECT_EQ(r.finish, Finish::kLength) << "request " << i << ": " << r.error;
    EXPECT_EQ(sinks[i].tokens, expected[i]) << "request " << i;
  }
  // At most the first request started alone; the other 7-token prompts went together, and so did the 8- and
  // 13-token ones.
  EXPECT_GE(eng->stats().batched_prompts, 9);
  EXPECT_EQ(eng->stats().running, 0);
  EXPECT_EQ(eng->stats().reused_prompt_tokens, 0);
  // Prompt 5 again (its whole prompt saved, row 4 or 5 of a batch), and prompt 6's first chunk with other tokens after.
  auto longer = std::vector<int64_t>(prompts[6].begin(), prompts[6].begin() + 8);
  for (int64_t t : prompt_of(6, 399)) longer.push_back(t + 1);
  for (const auto& prompt : {prompts[5], longer}) {
    Sink s;
    eng->submit({prompt, {0.0, 1.0, 0, 0}, 4, {}, {}}, s.callbacks());
    EXPECT_EQ(s.wait().finish, Finish::kLength);
    EXPECT_EQ(s.tokens, test::greedy_reference(*m, prompt, 4, {}, {}));
  }
  EXPECT_EQ(eng->stats().reused_prompt_tokens, 7 + 8);
}

TEST(BatchEngine, SampledRequestsRepeatAloneAndAmongOthers) {
  test::single_threaded();
  auto m = hybrid_model(12);
  const auto p = prompt_of(9, 7);
  // With penalties, which count this request's own prompt and tokens only.
  const Request sampled{p, {0.9, 0.95, 40, 1234, 1.3, 0.2, 0.4}, 16, {}, {}};
  // Alone, through the model's own generation loop (engine::generate).
  GenerationOptions go;
  go.max_tokens = 16;
  go.sampling = {0.9, 40, 0.95, 1234, 1.3, 0.2, 0.4};
  const auto alone = generate(*m, p, go);
  ASSERT_EQ(alone.size(), 16u);
  DecodeEngineOptions o;
  o.slots = 4;
  auto eng = make_batch_engine({m}, o);
  Sink a, b, c, d;
  eng->submit({prompt_of(20, 8), {1.0, 1.0, 0, 5, 1.1}, 12, {}, {}}, b.callbacks());
  eng->submit(sampled, a.callbacks());
  eng->submit({prompt_of(4, 9), {0.0, 1.0, 0, 0}, 3, {}, {}}, c.callbacks());
  eng->submit({p, {0.9, 0.95, 40, 1235}, 16, {}, {}}, d.callbacks());
  for (auto* s : {&a, &b, &c, &d}) EXPECT_EQ(s->wait().finish, Finish::kLength);
  EXPECT_EQ(a.tokens, alone);
  EXPECT_NE(d.tokens, alone);  // another seed
}

TEST(BatchEngine, StopIdsAndCancellationFreeTheirRows) {
  test::single_threaded();
  auto m = hybrid_model(13);
  const auto p = prompt_of(6, 3);
  const auto free_run = test::greedy_reference(*m, p, 10, {}, {});
  const int64_t stop = free_run[4];
  const auto until_stop = test::greedy_reference(*m, p, 10, {}, {stop});
  ASSERT_LT(until_stop.size(), 10u);
  DecodeEngineOptions o;
  o.slots = 2;
  Sink stopped, cancelled, after;  // before the engine: its worker may touch them until it is joined
  test::Signal held, release;
  auto eng = make_batch_engine({m}, o);
  test::SetOnExit let_go{release};
  eng->submit({p, {0.0, 1.0, 0, 0}, 10, {stop}, {}}, stopped.callbacks());
  // The long request's first token after the stopped one has ended holds the worker until the test has cancelled
  // it, so it cannot reach its 200 tokens first however the threads are scheduled (both ends run on the worker).
  size_t tokens_when_held = 0;
  const auto id = eng->submit({prompt_of(5, 4), {0.0, 1.0, 0, 0}, 200, {}, {}}, cancelled.callbacks([&](int64_t) {
    {
      std::lock_guard l(stopped.mu);
      if (!stopped.result) return;
    }
    if (held.wait(std::chrono::seconds(0))) return;  // held once
    {
      std::lock_guard l(cancelled.mu);
      tokens_when_held = cancelled.tokens.size();
    }
    held.set();
    release.wait();
  }));
  EXPECT_EQ(stopped.wait().finish, Finish::kStop);
  EXPECT_EQ(stopped.tokens, until_stop);
  ASSERT_TRUE(held.wait()) << "the long request produced no token after the stopped one ended";
  eng->cancel(id);
  release.set();
  const auto r = cancelled.wait();
  EXPECT_EQ(r.finish, Finish::kCancelled);
  // It ends after the token in flight: the one whose callback held the worker.
  EXPECT_EQ(r.completion_tokens, static_cast<int64_t>(tokens_when_held));
  EXPECT_EQ(cancelled.tokens.size(), tokens_when_held);
  EXPECT_LT(tokens_when_held, 200u);
  EXPECT_EQ(eng->stats().running, 0);
  // Both rows are free again: a new request runs and equals its reference.
  eng->submit({p, {0.0, 1.0, 0, 0}, 10, {}, {}}, after.callbacks());
  EXPECT_EQ(after.wait().finish, Finish::kLength);
  EXPECT_EQ(after.tokens, free_run);
}

// Later prompts that start like an earlier one continue from its saved state (at chunk boundaries and at its end)
// and still get the tokens the model's own loop gives them; the counter moves only by restored tokens.
TEST(BatchEngine, PrefixCacheRestoresStatesThatGiveTheSameTokens) {
  test::single_threaded();
  auto m = hybrid_model(16);
  auto run = [&](Engine& eng, const std::vector<int64_t>& prompt) {
    Sink s;
    eng.submit({prompt, {0.0, 1.0, 0, 0}, 6, {}, {}}, s.callbacks());
    EXPECT_EQ(s.wait().finish, Finish::kLength);
    EXPECT_EQ(s.tokens, test::greedy_reference(*m, prompt, 6, {}, {}));
    return eng.stats().reused_prompt_tokens;
  };
  const auto a = prompt_of(24, 5);                           // saved after 8, 16 and 24 tokens
  auto b = std::vector<int64_t>(a.begin(), a.begin() + 16);  // shares 16 tokens with a
  for (int64_t t : prompt_of(5, 6)) b.push_back(t + 1);
  const auto other = prompt_of(24, 7);
  DecodeEngineOptions o;
  o.slots = 2;
  o.prefill_chunk = 8;
  auto eng = make_batch_engine({m}, o);
  EXPECT_EQ(run(*eng, a), 0);
  EXPECT_EQ(run(*eng, b), 16);
  EXPECT_EQ(run(*eng, a), 16 + 24);  // the whole prompt: no prefill at all
  EXPECT_EQ(run(*eng, other), 40);
  // A budget between the memory of an 8-token and a 16-token prefix (its state and its [1, V] logits) keeps only the
  // prefixes that fit in it: a's first 8 tokens.
  const int64_t logits = m->recipe().vocab_size * 4;
  o.prefix_cache_bytes = (m->new_state(1, 8).bytes() + m->new_state(1, 16).bytes()) / 2 + logits;
  auto small = make_batch_engine({m}, o);
  EXPECT_EQ(run(*small, a), 0);
  EXPECT_EQ(run(*small, b), 8);
  // Room for one 8-token prefix: a later one takes the place of the least recently used.
  o.prefix_cache_bytes = m->new_state(1, 8).bytes() + logits;
  auto one = make_batch_engine({m}, o);
  EXPECT_EQ(run(*one, a), 0);
  EXPECT_EQ(run(*one, a), 8);
  EXPECT_EQ(run(*one, other), 8);  // other's first 8 tokens take the place of a's
  EXPECT_EQ(run(*one, a), 8);      // so a starts from nothing again
  o.prefix_cache_bytes = 0;
  auto off = make_batch_engine({m}, o);
  run(*off, a);
  EXPECT_EQ(run(*off, a), 0);
}

// Each request's next-token logits after its prompt, by id, as the batch engine's test hook reports them.
struct LogitsProbe {
  std::mutex mu;
  std::map<RequestId, torch::Tensor> logits;
  PromptLogitsHook hook() {
    return [this](RequestId id, const torch::Tensor& l) {
      std::lock_guard g(mu);
      logits[id] = l.to(torch::kCPU, torch::kFloat).clone();
    };
  }
};

// One greedy request at a time: its result, tokens, first-token logits (from the probe) and how far it moved
// Stats::reused_prompt_tokens.
struct Answer {
  Result result;
  std::vector<int64_t> tokens;
  torch::Tensor logits;
  int64_t reused = 0;
};
Answer ask(Engine& eng, LogitsProbe& probe, const std::vector<int64_t>& prompt, std::vector<int64_t> cache_points) {
  Sink s;
  const int64_t before = eng.stats().reused_prompt_tokens;
  const auto id = eng.submit({prompt, {0.0, 1.0, 0, 0}, 6, {}, {}, std::move(cache_points)}, s.callbacks());
  Answer a{s.wait(), {}, {}, 0};
  a.tokens = s.tokens;
  a.reused = eng.stats().reused_prompt_tokens - before;
  std::lock_guard g(probe.mu);
  a.logits = probe.logits[id];
  EXPECT_TRUE(a.logits.defined()) << "no logits reported";
  return a;
}

// The model's own next-token logits after the whole prompt in one forward (the reference greedy_reference starts from).
torch::Tensor whole_prefill_logits(model::HybridLM& m, const std::vector<int64_t>& prompt) {
  torch::NoGradGuard no_grad;
  auto state = m.new_state(1, static_cast<int64_t>(prompt.size()));
  return m.prefill(torch::tensor(prompt, torch::kLong).unsqueeze(0), state)
      .select(1, static_cast<int64_t>(prompt.size()) - 1)
      .to(torch::kFloat);
}

// An editor's keystrokes (text/infill_prompt.h's SPM order: only the prompt's tail changes): request A keeps its
// state at a cache point 3 tokens before its end (and at one inside its first chunk, as the end of the extra
// context), request B shares those 18 tokens and then differs. B restores exactly those 18 tokens, which only a cache
// point offers on a recurrent model (the chunk boundary before them is 16), and its logits and tokens are those of
// the model's own prefill of the whole prompt; with the same cache points an uncached run splits its prefill the
// same way, and B's logits equal that run's to the bit.
TEST(BatchEngine, CachePointsLetAKeystrokeRestoreAllButThePromptsTail) {
  test::single_threaded();
  auto m = hybrid_model(18);  // Mamba-3 and M2RNN states, which cannot be rewound, among attention and Engram
  const auto a = prompt_of(21, 31);
  auto b = std::vector<int64_t>(a.begin(), a.begin() + 18);
  for (int64_t t : prompt_of(4, 32)) b.push_back(t + 1);
  ASSERT_NE(b[18], a[18]);
  const std::vector<int64_t> points = {5, 18};
  const auto want_b = whole_prefill_logits(*m, b);
  ASSERT_GT(test::max_abs_diff(want_b, whole_prefill_logits(*m, a)), 1e-2);  // the check below can fail
  DecodeEngineOptions o;
  o.slots = 2;
  o.prefill_chunk = 8;
  LogitsProbe probe;
  auto eng = make_batch_engine({m}, o, probe.hook());
  const auto first = ask(*eng, probe, a, points);
  EXPECT_EQ(first.result.finish, Finish::kLength) << first.result.error;
  EXPECT_EQ(first.result.cached_tokens, 0);  // a miss
  EXPECT_EQ(first.tokens, test::greedy_reference(*m, a, 6, {}, {}));
  const auto next = ask(*eng, probe, b, points);
  EXPECT_EQ(next.result.finish, Finish::kLength) << next.result.error;
  EXPECT_EQ(next.result.prompt_tokens, 22);
  EXPECT_EQ(next.result.cached_tokens, 18);
  EXPECT_EQ(next.reused, 18);
  EXPECT_EQ(next.tokens, test::greedy_reference(*m, b, 6, {}, {}));
  EXPECT_LT(test::max_abs_diff(next.logits, want_b), 1e-4);
  {
    LogitsProbe fresh_probe;
    auto fresh = make_batch_engine({m}, o, fresh_probe.hook());
    const auto uncached = ask(*fresh, fresh_probe, b, points);
    EXPECT_EQ(uncached.result.cached_tokens, 0);
    EXPECT_EQ(uncached.tokens, next.tokens);
    EXPECT_TRUE(torch::equal(uncached.logits, next.logits));
  }
  // B without cache points of its own still starts from A's state at 18 (another split of its prefill: float
  // rounding only).
  auto c = b;
  c.back() += 1;
  const auto other_split = ask(*eng, probe, c, {});
  EXPECT_EQ(other_split.result.cached_tokens, 18);
  EXPECT_EQ(other_split.tokens, test::greedy_reference(*m, c, 6, {}, {}));
  EXPECT_LT(test::max_abs_diff(other_split.logits, whole_prefill_logits(*m, c)), 1e-4);
  // Without the cache point A keeps only its chunk boundaries and its end: B restores 16 tokens.
  {
    LogitsProbe plain_probe;
    auto plain = make_batch_engine({m}, o, plain_probe.hook());
    EXPECT_EQ(ask(*plain, plain_probe, a, {}).result.cached_tokens, 0);
    const auto boundary = ask(*plain, plain_probe, b, {});
    EXPECT_EQ(boundary.result.cached_tokens, 16);
    EXPECT_EQ(boundary.tokens, next.tokens);
  }
  // With the cache off nothing is restored, cache points or not.
  o.prefix_cache_bytes = 0;
  LogitsProbe off_probe;
  auto off = make_batch_engine({m}, o, off_probe.hook());
  for (const auto& prompt : {a, b, b}) {
    const auto r = ask(*off, off_probe, prompt, points);
    EXPECT_EQ(r.result.cached_tokens, 0);
    EXPECT_EQ(r.reused, 0);
    EXPECT_EQ(r.tokens, test::greedy_reference(*m, prompt, 6, {}, {}));
    EXPECT_LT(test::max_abs_diff(r.logits, whole_prefill_logits(*m, prompt)), 1e-4);
  }
}

// Cache points at 0, below it, at or past the prompt's end and repeated, in any order, are ignored; the valid ones
// (5, 11) are kept once each, and a later prompt restores at the longest of them (and the chunk boundary 8) that it
// shares.
TEST(BatchEngine, CachePointsOutsideThePromptAreIgnored) {
  test::single_threaded();
  auto m = hybrid_model(19);
  DecodeEngineOptions o;
  o.slots = 2;
  o.prefill_chunk = 8;
  LogitsProbe probe;
  auto eng = make_batch_engine({m}, o, probe.hook());
  const auto a = prompt_of(14, 41);
  const auto first = ask(*eng, probe, a, {14, 0, -3, 11, 1000, 15, 5, 5, 11, std::numeric_limits<int64_t>::min()});
  EXPECT_EQ(first.result.finish, Finish::kLength) << first.result.error;
  EXPECT_EQ(first.result.cached_tokens, 0);
  EXPECT_EQ(first.tokens, test::greedy_reference(*m, a, 6, {}, {}));
  auto sharing = [&](int64_t shared, uint64_t seed) {
    auto p = std::vector<int64_t>(a.begin(), a.begin() + shared);
    p.push_back(a[static_cast<size_t>(shared)] + 1);  // the first token that differs
    const auto tail = prompt_of(5, seed);
    p.insert(p.end(), tail.begin() + 1, tail.end());
    return p;
  };
  for (const auto& [shared, restored] : std::vector<std::pair<int64_t, int64_t>>{{4, 0}, {6, 5}, {10, 8}, {13, 11}}) {
    const auto p = sharing(shared, 50 + static_cast<uint64_t>(shared));
    const auto r = ask(*eng, probe, p, {});
    EXPECT_EQ(r.result.cached_tokens, restored) << "sharing " << shared << " tokens";
    EXPECT_EQ(r.reused, restored) << "sharing " << shared << " tokens";
    EXPECT_EQ(r.tokens, test::greedy_reference(*m, p, 6, {}, {})) << "sharing " << shared << " tokens";
  }
  EXPECT_EQ(ask(*eng, probe, a, {}).result.cached_tokens, 14);  // the whole prompt
}

// Prompts waiting together with a cache point inside their first chunk run the chunk up to it in one forward; the
// states there are kept as rows of the batch's state, and a later prompt restores one of them.
TEST(BatchEngine, ACachePointInsideABatchedFirstChunkIsKept) {
  test::single_threaded();
  auto m = hybrid_model(20);
  DecodeEngineOptions o;
  o.slots = 4;
  o.prefill_chunk = 8;
  EngineModel em{m};
  auto eng = make_batch_engine(em, o);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<Sink> sinks(4);
  {
    std::lock_guard hold(*em.in_use);  // they wait together (at most the first starts alone)
    for (size_t i = 0; i < sinks.size(); ++i) {
      prompts.push_back(prompt_of(7, 60 + i));
      eng->submit({prompts.back(), {0.0, 1.0, 0, 0}, 4, {}, {}, {4}}, sinks[i].callbacks());
    }
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    const auto r = sinks[i].wait();
    EXPECT_EQ(r.finish, Finish::kLength) << "request " << i << ": " << r.error;
    EXPECT_EQ(r.cached_tokens, 0);
    EXPECT_EQ(sinks[i].tokens, test::greedy_reference(*m, prompts[i], 4, {}, {})) << "request " << i;
  }
  EXPECT_GE(eng->stats().batched_prompts, 3);
  auto later = std::vector<int64_t>(prompts[3].begin(), prompts[3].begin() + 5);
  later.push_back(prompts[3][5] + 1);
  Sink s;
  eng->submit({later, {0.0, 1.0, 0, 0}, 4, {}, {}}, s.callbacks());
  EXPECT_EQ(s.wait().cached_tokens, 4);
  EXPECT_EQ(s.tokens, test::greedy_reference(*m, later, 4, {}, {}));
}

TEST(BatchEngine, MlaModelsTakeTheOneAtATimeEngine) {
  auto m = hybrid_model(14, hybrid_json(/*mla=*/true));
  EXPECT_NE(batch_decode_blocker(*m).find("MLA"), std::string::npos);
  EXPECT_THROW(make_batch_engine({m}, {}), Error);
  auto eng = make_decode_engine({m}, {});  // falls back, still serves
  for (int i = 0; i < 2; ++i) {            // it keeps no prefix states: the cache point changes nothing
    Sink s;
    eng->submit({prompt_of(5, 1), {0.0, 1.0, 0, 0}, 4, {}, {}, {3}}, s.callbacks());
    const auto r = s.wait();
    EXPECT_EQ(r.finish, Finish::kLength);
    EXPECT_EQ(r.cached_tokens, 0);
    EXPECT_EQ(s.tokens, test::greedy_reference(*m, prompt_of(5, 1), 4, {}, {}));
  }
}

// The engine asks the model what its decode can do (HybridLM::decode_support); each refusal names its cause, and a
// stage change (DSA warm-up) or the Engram placement is seen on the next question.
TEST(BatchEngine, TheModelSaysWhatItsDecodeSupports) {
#ifdef SLM_WITH_CUDA
  const std::string graph_at_32 = "";
#else
  // Without CUDA no head dim has a decode kernel: the first attention layer (layer 0, without DSA) refuses graphs.
  const std::string graph_at_32 =
      "attention head dim 32 has no CUDA decode kernel (32, 64, 128, 256), and its reference reads the lengths on the "
      "host";
#endif
  auto j = hybrid_json();
  j["attention"]["head_dim"] = 32;  // a head dim the CUDA decode kernel has
  j["attention"]["dsa_enabled"] = true;  // on layer 4
  auto m = hybrid_model(18, j);
  EXPECT_EQ(m->decode_support().batched_rows, "");
  EXPECT_EQ(m->decode_support().cuda_graph, graph_at_32);
  m->set_dsa_stage(model::DsaStage::Warmup);
  EXPECT_EQ(m->decode_support().batched_rows,
            "DSA attention in its dense warm-up stage reads its cache by the host's length");
  EXPECT_NE(m->decode_support().cuda_graph, "");
  m->set_dsa_stage(model::DsaStage::Sparse);
  EXPECT_EQ(m->decode_support().batched_rows, "");
  EXPECT_EQ(m->decode_support().cuda_graph, graph_at_32);
  m->set_engram_host_resident(true);  // the model's own refusal comes before its layers'
  EXPECT_EQ(m->decode_support().cuda_graph, "Engram tables in host memory are gathered on the host");
  EXPECT_EQ(m->decode_support().batched_rows, "");

  j["attention"]["head_dim"] = 24;  // no CUDA decode kernel in any build: graphs only are refused
  j["attention"]["dsa_enabled"] = false;
  auto odd = hybrid_model(18, j);
  EXPECT_NE(odd->decode_support().cuda_graph.find("head dim 24 has no CUDA decode kernel"), std::string::npos);
  EXPECT_EQ(odd->decode_support().batched_rows, "");

  auto mla = hybrid_model(18, hybrid_json(/*mla=*/true));
  for (const auto& why : {mla->decode_support().batched_rows, mla->decode_support().cuda_graph})
    EXPECT_NE(why.find("MLA attention reads its cache by the host's length"), std::string::npos) << why;
}

// On the GPU each batch size replays its own CUDA graph, DSA, Engram and mHC included; every request still gets
// the tokens of the model's own (eager) loop.
TEST(BatchEngine, CudaGraphBucketsGiveEachRequestItsTokens) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto j = hybrid_json();
  j["attention"]["head_dim"] = 32;       // a head dim the CUDA decode kernel has (graph_decode_blocker)
  j["attention"]["dsa_enabled"] = true;  // layer 4, selecting on the device
  auto m = hybrid_model(17, j, torch::kCUDA);
  {
    auto probe = m->new_state(1, 8);
    ASSERT_EQ(graph_decode_blocker(*m, probe), "");
    m->set_engram_host_resident(true);  // then the rows are gathered on the host: no capture
    EXPECT_NE(graph_decode_blocker(*m, probe).find("host memory"), std::string::npos);
    m->set_engram_host_resident(false);
  }
  std::vector<std::vector<int64_t>> prompts, expected;
  for (int i = 0; i < 7; ++i) {
    prompts.push_back(prompt_of(4 + 3 * i, 200 + i));
    expected.push_back(test::greedy_reference(*m, prompts.back(), 5 + 2 * i, {}, {}));
  }
  DecodeEngineOptions o;
  o.slots = 8;
  auto eng = make_batch_engine({m}, o);
  std::vector<Sink> sinks(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    eng->submit({prompts[i], {0.0, 1.0, 0, 0}, 5 + 2 * static_cast<int64_t>(i), {}, {}}, sinks[i].callbacks());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto r = sinks[i].wait();
    EXPECT_EQ(r.finish, Finish::kLength) << r.error;
    EXPECT_EQ(sinks[i].tokens, expected[i]) << "request " << i;
  }
}

// The row primitives on their own: a row copied out of one state and a view of rows decode exactly as the
// sequences did in their own states.
TEST(DecodeStateRows, CopiedRowsAndViewsDecodeLikeTheirOwnStates) {
  test::single_threaded();
  torch::NoGradGuard no_grad;
  auto m = hybrid_model(15);
  const auto a = test::random_tokens(1, 7, 500, 1), b = test::random_tokens(1, 12, 500, 2);
  auto sa = m->new_state(1, 32), sb = m->new_state(1, 32);
  m->prefill(a, sa);
  m->prefill(b, sb);
  auto pool = m->new_state(3, 32);
  pool.copy_row(sa, 0, 2, 7);
  pool.copy_row(sb, 0, 0, 12);
  pool.copy_row(pool, 0, 1, 12);  // within the pool: row 1 is b again
  auto rows = pool.view_rows(0, 3);
  rows.positions.copy_(torch::tensor({12, 12, 7}, torch::kLong));
  rows.shift_length(-rows.length);
  const auto next = torch::tensor({5, 9, 33}, torch::kLong);
  auto got = m->decode(next, rows);
  auto want_b = m->decode(torch::tensor({5}, torch::kLong), sb);
  auto want_a = m->decode(torch::tensor({33}, torch::kLong), sa);
  EXPECT_LT(test::max_abs_diff(got[0], want_b[0]), 1e-5);
  EXPECT_LT(test::max_abs_diff(got[2], want_a[0]), 1e-5);
  EXPECT_GT(test::max_abs_diff(got[1], got[0]), 1e-3);  // row 1 is b fed another token
  EXPECT_THROW(pool.copy_row(sa, 0, 3, 7), Error);
  EXPECT_THROW(pool.copy_row(sa, 0, 0, 40), Error);
  EXPECT_THROW(pool.view_rows(2, 2), Error);
}

// Several rows in one copy: rows 1..2 of a batch of three prompts of 9 tokens into rows 0..1 of a pool, which then
// decode as those prompts' own states do; the row range is checked.
TEST(DecodeStateRows, ABlockOfRowsCopiesInOneCall) {
  test::single_threaded();
  torch::NoGradGuard no_grad;
  auto m = hybrid_model(17);
  const auto prompts = test::random_tokens(3, 9, 500, 4);
  auto batch = m->new_state(3, 16);
  m->prefill(prompts, batch);
  auto pool = m->new_state(4, 32);
  pool.copy_rows(batch, 1, 0, 2, 9);
  auto rows = pool.view_rows(0, 2);
  rows.positions.copy_(torch::tensor({9, 9}, torch::kLong));
  rows.shift_length(-rows.length);
  const auto got = m->decode(torch::tensor({5, 9}, torch::kLong), rows);
  for (int64_t r = 0; r < 2; ++r) {
    auto own = m->new_state(1, 16);
    m->prefill(prompts.narrow(0, r + 1, 1), own);
    const auto want = m->decode(torch::tensor({r == 0 ? 5 : 9}, torch::kLong), own);
    EXPECT_LT(test::max_abs_diff(got[r], want[0]), 1e-5) << "row " << r;
  }
  EXPECT_THROW(pool.copy_rows(batch, 2, 0, 2, 9), Error);  // batch rows 2..3: the batch has 3
  EXPECT_THROW(pool.copy_rows(batch, 0, 3, 2, 9), Error);  // pool rows 3..4: the pool has 4
}

}  // namespace
}  // namespace slm::engine
