// The sampler's modes and seeding, and the byte-level tokenizer.
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
