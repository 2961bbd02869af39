// The token-level mixture ("auto-2"): generate_mixture's greedy tokens against a reference written out here (each
// model's full forward over the growing sequence, the weighted probabilities mixed in float64, argmax), its limits,
// and the mixture engine taking turns with the members' own engines.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/engine_test_util.h"
#include "slm/engine/decode_engine.h"
#include "slm/engine/generation.h"

namespace slm::engine {
namespace {

const std::vector<int64_t> kPrompt = {2, 300, 301, 45, 7, 400};

// Greedy tokens of p = Σ w_i softmax(forward_i(sequence))[last], from scratch at every step.
std::vector<int64_t> mixture_reference(const std::vector<model::HybridLM*>& models, const std::vector<double>& w,
                                       int64_t max_tokens) {
  torch::NoGradGuard ng;
  std::vector<int64_t> seq = kPrompt, out;
  double total = 0;
  for (double x : w) total += x;
  for (int64_t i = 0; i < max_tokens; ++i) {
    torch::Tensor p;
    for (size_t k = 0; k < models.size(); ++k) {
      auto logits = models[k]->forward(torch::tensor(seq, torch::kLong).unsqueeze(0)).logits[0][-1];
      auto pk = torch::softmax(logits.to(torch::kDouble), -1) * (w[k] / total);
      p = p.defined() ? p + pk : pk;
    }
    const int64_t id = p.argmax().item<int64_t>();
    out.push_back(id);
    seq.push_back(id);
  }
  return out;
}

struct Done {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> tokens;
  bool done = false;
  Callbacks callbacks() {
    return {[this](int64_t t) {
              std::lock_guard l(mu);
              tokens.push_back(t);
            },
            [this](const Result&) {
              std::lock_guard l(mu);
              done = true;
              cv.notify_all();
            }};
  }
  std::vector<int64_t> wait() {
    std::unique_lock l(mu);
    cv.wait_for(l, std::chrono::seconds(60), [&] { return done; });
    EXPECT_TRUE(done);
    return tokens;
  }
};

TEST(Mixture, GreedyTokensEqualTheMixedProbabilitiesOfFullForwards) {
  test::single_threaded();
  auto a = test::serving_model(1), b = test::serving_model(2);
  GenerationOptions o;
  o.max_tokens = 16;
  o.sampling.temperature = 0;
  for (const auto& w : std::vector<std::vector<double>>{{0.7, 0.3}, {0.2, 0.8}, {1.0, 1.0}}) {
    const auto expected = mixture_reference({a.get(), b.get()}, w, 16);
    EXPECT_EQ(generate_mixture({{a.get(), w[0]}, {b.get(), w[1]}}, kPrompt, o), expected) << w[0] << "/" << w[1];
  }
  // The two models disagree somewhere, so the mixture is not trivially one of them.
  EXPECT_NE(generate(*a, kPrompt, o), generate(*b, kPrompt, o));
  // A vanishing weight leaves the other model's own greedy tokens.
  EXPECT_EQ(generate_mixture({{a.get(), 1.0}, {b.get(), 1e-12}}, kPrompt, o), generate(*a, kPrompt, o));
}

TEST(Mixture, RefusesBadWeightsAndDifferentVocabularies) {
  test::single_threaded();
  auto a = test::serving_model(1);
  model::HybridLM other(load_recipe(test::source_path("recipes/tiny-ae.json")));  // 384 ids, not 512
  GenerationOptions o;
  EXPECT_THROW(generate_mixture({{a.get(), 1.0}, {&other, 1.0}}, {1, 2}, o), Error);
  EXPECT_THROW(generate_mixture({{a.get(), 1.0}, {a.get(), 0.0}}, {1, 2}, o), Error);
  EXPECT_THROW(generate_mixture({}, {1, 2}, o), Error);
  EXPECT_THROW(make_mixture_engine({EngineModel{a}}, {}), Error);
  auto mix = make_mixture_engine({EngineModel{a}, EngineModel{test::serving_model(2)}}, {});
  Request r{kPrompt, {0.0, 1.0, 0, 0}, 4, {}, {1.0}};
  EXPECT_THROW(mix->submit(r, {}), Error);  // one weight for two models
  r.mixture_weights = {1.0, -1.0};
  EXPECT_THROW(mix->submit(r, {}), Error);
}

// The mixture engine and the members' own engines share the models; requests on all of them at once each get the
// tokens they would get alone.
TEST(Mixture, EngineTakesTurnsWithTheMembersOwnEngines) {
  test::single_threaded();
  EngineModel a{test::serving_model(1)}, b{test::serving_model(2)};
  auto ea = make_decode_engine(a, {}), eb = make_decode_engine(b, {});
  auto mix = make_mixture_engine({a, b}, {});
  const auto alone_a = test::greedy_reference(*a.model, kPrompt, 12, {}, {});
  const auto alone_b = test::greedy_reference(*b.model, kPrompt, 12, {}, {});
  ASSERT_NE(alone_a, alone_b) << "the two models must differ for the check to tell their engines apart";
  const auto mixed = mixture_reference({a.model.get(), b.model.get()}, {0.6, 0.4}, 12);
  std::vector<std::unique_ptr<Done>> sinks;
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(std::make_unique<Done>());
    mix->submit({kPrompt, {0.0, 1.0, 0, 0}, 12, {}, {0.6, 0.4}}, sinks.back()->callbacks());
    sinks.push_back(std::make_unique<Done>());
    ea->submit({kPrompt, {0.0, 1.0, 0, 0}, 12, {}, {}}, sinks.back()->callbacks());
    sinks.push_back(std::make_unique<Done>());
    eb->submit({kPrompt, {0.0, 1.0, 0, 0}, 12, {}, {}}, sinks.back()->callbacks());
  }
  for (size_t i = 0; i < sinks.size(); i += 3) {
    EXPECT_EQ(sinks[i]->wait(), mixed);
    EXPECT_EQ(sinks[i + 1]->wait(), alone_a);
    EXPECT_EQ(sinks[i + 2]->wait(), alone_b);
  }
}

}  // namespace
}  // namespace slm::engine
