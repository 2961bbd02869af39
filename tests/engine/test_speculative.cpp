// Speculative decoding (GenerationOptions::speculative): greedy output equal to plain generation on every cache kind,
// the same ends (stop id, stop texts, max_tokens, the callback), seeded sampling reproducible and distributed exactly
// as the sampler's distribution, and bad options refused.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine_test_util.h"
#include "slm/engine/generation.h"
#include "slm/text/text_generation.h"

namespace slm::engine {
namespace {

using test::random_model;

std::vector<int64_t> run(model::HybridLM& m, const std::vector<int64_t>& prompt, GenerationOptions o,
                         int64_t speculative, GenerationStats* stats = nullptr,
                         const std::function<bool(int64_t)>& on_token = {}) {
  o.speculative = speculative;
  return generate(m, prompt, o, on_token, stats);
}

GenerationOptions greedy(int64_t max_tokens) {
  GenerationOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0.0;
  return o;
}

// Random weights draft badly, so the rounds mix kept and rejected drafts: both paths, and every rollback depth, run.
TEST(Speculative, GreedyEqualsPlainDecodingOnTheHybridPattern) {
  test::single_threaded();
  auto m = random_model(test::spec_hybrid_json(), 41, torch::kDouble);
  GenerationStats total;
  for (uint64_t p = 0; p < 4; ++p) {
    const auto prompt = test::random_tokens(1, 3 + 5 * p, 29, 50 + p);
    const std::vector<int64_t> ids(prompt.data_ptr<int64_t>(), prompt.data_ptr<int64_t>() + prompt.numel());
    const auto plain = run(*m, ids, greedy(48), 0);
    ASSERT_EQ(plain.size(), 48u);
    for (int64_t k : {1, 2}) {
      GenerationStats stats;
      EXPECT_EQ(run(*m, ids, greedy(48), k, &stats), plain) << "prompt " << p << ", " << k << " drafts";
      EXPECT_EQ(stats.decode_steps, 47);
      total.drafted += stats.drafted;
      total.accepted += stats.accepted;
    }
  }
  EXPECT_GT(total.accepted, 0);
  EXPECT_LT(total.accepted, total.drafted);
}

// MLA (in the main stack and the MTP module), DSA, mHC and Engram: tiny-full's one MTP module.
TEST(Speculative, GreedyEqualsPlainDecodingOnTinyFull) {
  test::single_threaded();
  model::HybridLM m(load_recipe(test::source_path("recipes/tiny-full.json")),
                    torch::TensorOptions().dtype(torch::kDouble));
  test::randomize(m, 42);
  m.eval();
  const std::vector<int64_t> prompt = {2, 300, 301, 45, 7, 400, 9, 9, 31};
  GenerationStats stats;
  EXPECT_EQ(run(m, prompt, greedy(40), 1, &stats), run(m, prompt, greedy(40), 0));
  EXPECT_GT(stats.drafted, 0);
}

// Generation ends where plain generation ends, never past a stop or max_tokens, whichever round the end falls in.
TEST(Speculative, EndsExactlyWherePlainGenerationEnds) {
  test::single_threaded();
  auto m = random_model(test::spec_hybrid_json(), 43, torch::kDouble);
  const std::vector<int64_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  const auto plain = run(*m, prompt, greedy(30), 0);
  for (int64_t n = 1; n <= 8; ++n)
    for (int64_t k : {1, 2}) EXPECT_EQ(run(*m, prompt, greedy(n), k), run(*m, prompt, greedy(n), 0)) << n;
  for (size_t i : {size_t{1}, size_t{5}, size_t{12}}) {
    auto o = greedy(30);
    o.stop_id = plain[i];
    for (int64_t k : {1, 2}) EXPECT_EQ(run(*m, prompt, o, k), run(*m, prompt, o, 0)) << "stop id " << plain[i];
  }
  for (int64_t stop_after : {1, 2, 3, 7}) {
    auto until = [stop_after](std::vector<int64_t>& seen) {
      return [&seen, stop_after](int64_t id) {
        seen.push_back(id);
        return static_cast<int64_t>(seen.size()) < stop_after;
      };
    };
    std::vector<int64_t> a, b;
    const auto spec = run(*m, prompt, greedy(30), 2, nullptr, until(a));
    EXPECT_EQ(spec, run(*m, prompt, greedy(30), 0, nullptr, until(b)));
    EXPECT_EQ(a, b);
    EXPECT_EQ(static_cast<int64_t>(spec.size()), stop_after);
  }
}

// The text path: stop texts cut at the same token (tiny-full's 512 ids are the code tokenizer's).
TEST(Speculative, TextStopsWhereThePlainTextStops) {
  test::single_threaded();
  model::HybridLM m(load_recipe(test::source_path("recipes/tiny-full.json")));
  test::randomize(m, 44);
  m.eval();
  auto o = greedy(40);
  auto text_of = [&](int64_t speculative) {
    auto with = o;
    with.speculative = speculative;
    std::string text;
    text::generate_text(m, test::code512(), "int main() {", with, [&](const std::string& t) { text += t; });
    return text;
  };
  const std::string whole = text_of(0);
  ASSERT_GE(whole.size(), 6u);
  o.stop_texts = {whole.substr(whole.size() / 2, 2)};
  const std::string cut = text_of(0);
  EXPECT_LT(cut.size(), whole.size());
  EXPECT_EQ(text_of(1), cut);
}

TEST(Speculative, SampledTokensAreReproducibleFromTheSeed) {
  test::single_threaded();
  auto m = random_model(test::spec_hybrid_json(), 45);
  GenerationOptions o;
  o.max_tokens = 40;
  o.sampling = {0.8, 10, 0.95, 7};
  const std::vector<int64_t> prompt = {1, 2, 3};
  GenerationStats stats;
  const auto a = run(*m, prompt, o, 2, &stats);
  EXPECT_EQ(run(*m, prompt, o, 2), a);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_GT(stats.drafted, 0);
  o.sampling.seed = 8;
  EXPECT_NE(run(*m, prompt, o, 2), a);
}

// The sampler's distribution after temperature and top-k: probabilities [V], double.
torch::Tensor next_distribution(model::HybridLM& m, const std::vector<int64_t>& seq, double temperature,
                                int64_t top_k) {
  torch::NoGradGuard no_grad;
  auto z = m.forward(torch::tensor(seq, torch::kLong).unsqueeze(0)).logits[0][-1].to(torch::kDouble) / temperature;
  auto kth = std::get<0>(z.topk(top_k)).select(0, top_k - 1);
  return torch::softmax(z.masked_fill(z < kth, -INFINITY), 0);
}

// Pearson's chi-square of counts against probabilities p (n draws), bins with fewer than 5 expected merged.
std::pair<double, int> chi_square(const std::vector<int64_t>& counts, const torch::Tensor& p, int64_t n) {
  double stat = 0, rest_expected = 0, rest_observed = 0;
  int bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = p[static_cast<int64_t>(i)].item<double>() * static_cast<double>(n);
    if (e < 5) {
      rest_expected += e;
      rest_observed += static_cast<double>(counts[i]);
      continue;
    }
    stat += std::pow(static_cast<double>(counts[i]) - e, 2) / e;
    ++bins;
  }
  if (rest_expected > 0) {
    stat += std::pow(rest_observed - rest_expected, 2) / rest_expected;
    ++bins;
  }
  return {stat, bins - 1};
}

// Speculative sampling keeps the sampler's distribution exactly: over many seeds, the second and third tokens (the
// first judged draft or the residual draw after its rejection; then a token after a rollback or a second draft)
// follow the exact marginals, enumerated here from full forwards (chi-square at p = 0.001).
TEST(Speculative, SampledTokensFollowTheSamplersDistribution) {
  test::single_threaded();
  auto j = test::micro_ae_json();  // 13 ids, two MTP modules
  auto m = random_model(j, 46, torch::kDouble);
  const double temperature = 0.7;
  const int64_t top_k = 6, vocab = 13, runs = 3000;
  const std::vector<int64_t> prompt = {4, 11, 2, 7};
  auto p1 = next_distribution(*m, prompt, temperature, top_k);
  auto p2 = torch::zeros({vocab}, torch::kDouble), p3 = torch::zeros({vocab}, torch::kDouble);
  for (int64_t a = 0; a < vocab; ++a) {
    if (p1[a].item<double>() == 0) continue;
    auto seq = prompt;
    seq.push_back(a);
    auto pa = next_distribution(*m, seq, temperature, top_k);
    p2 += p1[a] * pa;
    for (int64_t b = 0; b < vocab; ++b) {
      if (pa[b].item<double>() == 0) continue;
      auto seq2 = seq;
      seq2.push_back(b);
      p3 += p1[a] * pa[b] * next_distribution(*m, seq2, temperature, top_k);
    }
  }
  std::vector<int64_t> second(vocab), third(vocab);
  GenerationStats total;
  GenerationOptions o;
  o.max_tokens = 3;
  for (int64_t s = 0; s < runs; ++s) {
    o.sampling = {temperature, top_k, 1.0, static_cast<uint64_t>(s)};
    GenerationStats stats;
    const auto out = run(*m, prompt, o, 2, &stats);
    ASSERT_EQ(out.size(), 3u);
    ++second[out[1]];
    ++third[out[2]];
    total.drafted += stats.drafted;
    total.accepted += stats.accepted;
  }
  // Both branches ran often: kept drafts and residual draws.
  EXPECT_GT(total.accepted, total.drafted / 20);
  EXPECT_LT(total.accepted, total.drafted * 9 / 10);
  for (const auto& [name, counts, p] : {std::tuple{"second", second, p2}, std::tuple{"third", third, p3}}) {
    const auto [stat, df] = chi_square(counts, p, runs);
    // Wilson-Hilferty: the chi-square quantile at p = 0.001 (z = 3.09).
    const double h = 2.0 / (9.0 * df), critical = df * std::pow(1 - h + 3.09 * std::sqrt(h), 3);
    EXPECT_LT(stat, critical) << name << " token: chi-square " << stat << " with " << df << " degrees of freedom";
  }
}

TEST(Speculative, BadOptionsAreErrors) {
  test::single_threaded();
  auto m = random_model(test::spec_hybrid_json(), 47);
  const std::vector<int64_t> prompt = {1, 2};
  EXPECT_THROW(run(*m, prompt, greedy(4), 3), Error);  // beyond the MTP depth of 2
  EXPECT_THROW(run(*m, prompt, greedy(4), -1), Error);
  auto j = test::spec_hybrid_json();
  j.erase("mtp");
  auto plain = random_model(j, 47);
  EXPECT_THROW(run(*plain, prompt, greedy(4), 1), Error);
  auto o = greedy(4);
  o.speculative = 1;
  EXPECT_THROW(generate_mixture({{m.get(), 1.0}, {m.get(), 1.0}}, prompt, o), Error);
}

}  // namespace
}  // namespace slm::engine
