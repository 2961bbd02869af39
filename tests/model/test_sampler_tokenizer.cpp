// The sampler's modes and seeding, and the byte-level tokenizer.
#include <torch/cuda.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "model_test_util.h"
#include "slm/data/byte_tokenizer.h"
#include "slm/model/sampler.h"

using namespace slm;
using namespace slm::test;

namespace {
torch::Tensor sample_many(model::Sampler& s, const torch::Tensor& logits, int n) {
  std::vector<torch::Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits));
  return torch::cat(out);
}
}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  torch::manual_seed(1);
  auto logits = torch::randn({4, 50});
  model::Sampler s({0.0, 0, 1.0, 1});
  EXPECT_TRUE(torch::equal(s.sample(logits), logits.argmax(-1)));
  model::Sampler k1({1.0, 1, 1.0, 1});
  EXPECT_TRUE(torch::equal(k1.sample(logits), logits.argmax(-1)));
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  auto logits = torch::tensor({{0.0f, 3.0f, 1.0f, 2.9f, -1.0f, 2.0f}});
  model::Sampler k({1.0, 3, 1.0, 2});
  auto draws = sample_many(k, logits, 300);
  EXPECT_TRUE(((draws == 1) | (draws == 3) | (draws == 5)).all().item<bool>());
  EXPECT_TRUE((draws == 5).any().item<bool>());
  // Probabilities of 1 and 3 are ~0.38 and ~0.34: together they pass 0.6, so nothing else is drawn.
  model::Sampler p({1.0, 0, 0.6, 3});
  draws = sample_many(p, logits, 300);
  EXPECT_TRUE(((draws == 1) | (draws == 3)).all().item<bool>());
  EXPECT_TRUE((draws == 3).any().item<bool>());
  // A tiny top_p keeps only the most likely token.
  model::Sampler p0({1.0, 0, 1e-3, 3});
  EXPECT_TRUE((sample_many(p0, logits, 50) == 1).all().item<bool>());
}

TEST(Sampler, SameSeedSameDrawsDifferentSeedDifferentDraws) {
  auto logits = torch::zeros({1, 100});
  model::Sampler a({1.0, 0, 1.0, 42}), b({1.0, 0, 1.0, 42}), c({1.0, 0, 1.0, 43});
  auto da = sample_many(a, logits, 40), db = sample_many(b, logits, 40), dc = sample_many(c, logits, 40);
  EXPECT_TRUE(torch::equal(da, db));
  EXPECT_FALSE(torch::equal(da, dc));
}

TEST(Sampler, LowTemperatureSharpens) {
  auto logits = torch::tensor({{1.0f, 1.5f, 0.5f}});
  model::Sampler cold({0.05, 0, 1.0, 5});
  EXPECT_TRUE((sample_many(cold, logits, 100) == 1).all().item<bool>());
}

TEST(Sampler, RejectsBadOptions) {
  EXPECT_THROW(model::Sampler({-1.0, 0, 1.0, 0}), Error);
  EXPECT_THROW(model::Sampler({1.0, -2, 1.0, 0}), Error);
  EXPECT_THROW(model::Sampler({1.0, 0, 0.0, 0}), Error);
  EXPECT_THROW(model::Sampler({1.0, 0, 1.5, 0}), Error);
  EXPECT_THROW(model::Sampler({1.0, 0, 1.0, 0, 0.0}), Error);
  EXPECT_THROW(model::Sampler({1.0, 0, 1.0, 0, 1.0, 2.5}), Error);
  EXPECT_THROW(model::Sampler({1.0, 0, 1.0, 0, 1.0, 0.0, -3.0}), Error);
  model::Sampler outside({1.0, 0, 1.0, 0, 1.2});
  outside.set_prompt({3, 50});
  EXPECT_THROW(outside.sample(torch::zeros({1, 50})), Error);
}

namespace {

// The id drawn at uniform u from the float64 definition (sampler.h), by plain loops; -1 when u * total lies within
// 1e-9 of a running sum, where rounding may decide.
int64_t reference_draw(const std::vector<double>& logits, const model::SamplerOptions& o, double u) {
  const size_t v = logits.size();
  std::vector<double> z(v);
  for (size_t i = 0; i < v; ++i) z[i] = logits[i] / o.temperature;
  std::vector<size_t> order(v);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
  const double top = z[order[0]];
  double floor = -std::numeric_limits<double>::infinity();
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < v) floor = z[order[static_cast<size_t>(o.top_k) - 1]];
  double kept_mass = 0;
  for (size_t i = 0; i < v; ++i)
    if (z[i] >= floor) kept_mass += std::exp(z[i] - top);
  if (o.top_p < 1) {
    double before = 0;
    size_t last = 0;
    for (size_t j = 0; j < v && before < o.top_p; ++j) {
      last = j;
      if (z[order[j]] >= floor) before += std::exp(z[order[j]] - top) / kept_mass;
    }
    floor = std::max(floor, z[order[last]]);
  }
  std::vector<double> w(v);
  double total = 0;
  for (size_t i = 0; i < v; ++i) total += w[i] = z[i] >= floor ? std::exp(z[i] - top) : 0.0;
  const double target = u * total;
  double run = 0;
  int64_t id = -1;
  for (size_t i = 0; i < v; ++i) {
    run += w[i];
    if (std::abs(run - target) < 1e-9 * total) return -1;
    if (id < 0 && run > target) id = static_cast<int64_t>(i);
  }
  return id;
}

std::vector<torch::Device> devices() {
  std::vector<torch::Device> d{torch::kCPU};
  if (torch::cuda::is_available()) d.emplace_back(torch::kCUDA);
  return d;
}

}  // namespace

// Every row of a batch, each with its own temperature, top-k and top-p, draws at u exactly what the float64 loops
// draw; the logits are multiples of 1/4, so ties sit at the top-k and top-p edges.
TEST(Sampler, DrawsEqualTheFloat64DefinitionRowByRow) {
  const int64_t v = 300;
  const std::vector<model::SamplerOptions> rows = {{1.0, 0, 1.0, 0},   {0.7, 5, 1.0, 0}, {1.3, 0, 0.9, 0},
                                                   {1.0, 50, 0.3, 0},  {0.5, 1, 1.0, 0}, {2.0, 0, 1e-4, 0},
                                                   {1.0, v, 0.999, 0}, {0.9, 7, 0.8, 0}};
  const auto b = static_cast<int64_t>(rows.size());
  torch::manual_seed(3);
  const auto logits = torch::round(torch::randn({b, v}, torch::kDouble) * 8) / 4;
  std::vector<std::vector<double>> host(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    auto row = logits[r].contiguous();
    host[static_cast<size_t>(r)].assign(row.data_ptr<double>(), row.data_ptr<double>() + v);
  }
  for (const auto& device : devices()) {
    const auto probs = model::filtered_probabilities(logits.to(device, torch::kFloat), rows);
    int compared = 0;
    for (int i = 0; i < 60; ++i) {
      std::vector<double> u(static_cast<size_t>(b));
      for (int64_t r = 0; r < b; ++r) u[static_cast<size_t>(r)] = std::fmod(0.013 + 0.6180339887 * (i * b + r), 1.0);
      const auto ids = model::inverse_cdf(probs, u).cpu();
      for (int64_t r = 0; r < b; ++r) {
        const auto want =
            reference_draw(host[static_cast<size_t>(r)], rows[static_cast<size_t>(r)], u[static_cast<size_t>(r)]);
        if (want < 0) continue;
        ++compared;
        ASSERT_EQ(ids[r].item<int64_t>(), want) << device << " row " << r << " u " << u[static_cast<size_t>(r)];
      }
    }
    EXPECT_GT(compared, 400) << device;
    // The distributions themselves: rows sum to 1 and zero outside the kept set (row 4: top_k 1 keeps the maximum).
    EXPECT_LT((probs.sum(-1) - 1).abs().max().item<double>(), 1e-12);
    EXPECT_EQ((probs[4] > 0).sum().item<int64_t>(), (logits[4] == logits[4].max()).sum().item<int64_t>());
  }
  EXPECT_THROW(model::filtered_probabilities(logits, {rows[0]}), Error);
  EXPECT_THROW(model::filtered_probabilities(logits.narrow(0, 0, 1), {{0.0, 0, 1.0, 0}}), Error);
}

// The penalties on hand-computed values: ids 0 and 1 in the prompt, id 1 generated twice, id 2 once, id 3 never.
TEST(Sampler, PenaltiesAreTheHandComputedLogits) {
  const auto logits = torch::tensor({{2.0f, -1.0f, 3.0f, 0.5f}, {2.0f, -1.0f, 3.0f, 0.5f}});
  const auto generated = torch::tensor({{0.0f, 2.0f, 1.0f, 0.0f}, {0.0f, 2.0f, 1.0f, 0.0f}});
  const auto prompt = torch::tensor({{true, true, false, false}, {false, false, false, false}});
  const std::vector<model::SamplerOptions> rows = {{1.0, 0, 1.0, 0, 2.0, 0.5, 0.25}, {1.0, 0, 1.0, 0, 1.0, -1.0, 1.0}};
  for (const auto& device : devices()) {
    const auto out = model::apply_penalties(logits.to(device), generated.to(device), prompt.to(device), rows).cpu();
    // Row 0: 2/2; -1*2 - 0.5 - 2*0.25; 3/2 - 0.5 - 0.25; 0.5 untouched.
    // Row 1 (no repetition penalty): 2; -1 + 1 - 2; 3 + 1 - 1; 0.5.
    const auto want = torch::tensor({{1.0f, -3.0f, 0.75f, 0.5f}, {2.0f, -2.0f, 3.0f, 0.5f}});
    EXPECT_LT((out - want).abs().max().item<float>(), 1e-6) << device << "\n" << out;
  }
}

// Greedy with a repetition penalty of 1.2 on logits {2, 1.9, 0}: id 0, then (2 / 1.2 = 1.67 < 1.9) id 1, then
// (1.67 > 1.9 / 1.2 = 1.58) id 0 again; with the prompt holding id 0 the first pick is already id 1.
TEST(Sampler, RepetitionPenaltyCountsThePromptAndTheOutput) {
  const auto logits = torch::tensor({{2.0f, 1.9f, 0.0f}});
  model::Sampler fresh({0.0, 0, 1.0, 0, 1.2});
  fresh.set_prompt({2});
  std::vector<int64_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(fresh.sample(logits).item<int64_t>());
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 0, 0}));
  model::Sampler primed({0.0, 0, 1.0, 0, 1.2});
  primed.set_prompt({0, 2});
  EXPECT_EQ(primed.sample(logits).item<int64_t>(), 1);
  // Frequency 0.3: id 0 pays 0.3 per use, so after one use 1.7 < 1.9 and id 1 follows, then 1.7 > 1.6: id 0.
  model::Sampler frequency({0.0, 0, 1.0, 0, 1.0, 0.0, 0.3});
  got.clear();
  for (int i = 0; i < 3; ++i) got.push_back(frequency.sample(logits).item<int64_t>());
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 0}));
}

// Rows drawn together (greedy, sampled, penalized, filtered) get what each sampler draws alone from its row, step
// after step: a row's draw depends on its own logits, options and seed only.
TEST(Sampler, RowsDrawnTogetherEqualEachSamplerAlone) {
  const std::vector<model::SamplerOptions> rows = {{0.0, 0, 1.0, 0},
                                                   {1.0, 0, 1.0, 11},
                                                   {0.8, 20, 0.9, 12, 1.3},
                                                   {0.0, 0, 1.0, 0, 1.5, 0.5, 0.5},
                                                   {1.2, 0, 0.5, 14, 1.0, 1.0}};
  torch::manual_seed(4);
  for (const auto& device : devices()) {
    std::vector<model::Sampler> together, alone;
    for (const auto& o : rows) {
      together.emplace_back(o);
      alone.emplace_back(o);
      together.back().set_prompt({1, 2, 3});
      alone.back().set_prompt({1, 2, 3});
    }
    std::vector<model::Sampler*> ptrs;
    for (auto& s : together) ptrs.push_back(&s);
    for (int step = 0; step < 12; ++step) {
      const auto logits = (torch::randn({static_cast<int64_t>(rows.size()), 40}) * 2).to(device);
      const auto ids = model::Sampler::sample_rows(ptrs, logits);
      for (size_t r = 0; r < rows.size(); ++r)
        ASSERT_EQ(ids[r], alone[r].sample(logits.narrow(0, static_cast<int64_t>(r), 1)).item<int64_t>())
            << device << " row " << r << " step " << step;
    }
  }
}

TEST(ByteTokenizer, RoundTripsBytesAndMarksSpecials) {
  data::ByteTokenizer tok;
  std::string text = "int main(\xff\n";
  auto ids = tok.encode(text, true);
  ASSERT_EQ(ids.size(), text.size() + 1);
  EXPECT_EQ(ids[0], data::ByteTokenizer::kBos);
  EXPECT_EQ(ids.back(), '\n');
  EXPECT_EQ(ids[ids.size() - 2], 255);
  ids.push_back(data::ByteTokenizer::kEos);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.display(data::ByteTokenizer::kEos), "<eos>");
  EXPECT_EQ(tok.display('a'), "a");
  EXPECT_EQ(tok.display(0x07), "\\x07");
  EXPECT_THROW(tok.decode({259}), Error);
  EXPECT_THROW(tok.display(-1), Error);
}
