// Packed documents: each document of a training row gives the logits it gives alone, for every letter and feature
// (tiny-full: A with windows, GQA and MLA, DSA in both stages, E, M (MIMO), R, Engram, mHC, MTP), and MTP targets
// that would cross into another document are left out of the loss.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "model/model_test_util.h"
#include "slm/model/documents.h"
#include "slm/model/hybrid_lm.h"
#include "slm/model/layers/dsa_indexer.h"

using namespace slm;
using namespace slm::test;

namespace {

// Document ids [B, T] of rows cut into documents of the given lengths.
torch::Tensor ids_of(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<torch::Tensor> out;
  for (const auto& lengths : rows) {
    std::vector<int64_t> ids;
    for (size_t d = 0; d < lengths.size(); ++d) ids.insert(ids.end(), lengths[d], static_cast<int64_t>(d));
    out.push_back(torch::tensor(ids, torch::kLong));
  }
  return torch::stack(out);
}

}  // namespace

TEST(Documents, FromIdsGivesStartsAndPositions) {
  auto d = model::documents_from_ids(torch::tensor({0, 0, 1, 1, 1, 4, 0, 0, 0, 0, 0, 0}, torch::kInt).view({2, 6}));
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(torch::equal(d->start, torch::tensor({1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0}, torch::kBool).view({2, 6})));
  EXPECT_TRUE(torch::equal(d->pos, torch::tensor({0, 1, 0, 1, 2, 0, 0, 1, 2, 3, 4, 5}, torch::kLong).view({2, 6})));
  EXPECT_TRUE(torch::equal(d->id, torch::tensor({0, 0, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0}, torch::kLong).view({2, 6})));
  // Rows of one document each are the unpacked path.
  EXPECT_FALSE(model::documents_from_ids(torch::zeros({3, 5}, torch::kInt)).has_value());
  EXPECT_THROW(model::documents_from_ids(torch::zeros({5}, torch::kInt)), Error);
}

// Every letter and feature: a packed row of several documents gives, for each document, the logits (and the MTP
// logits) of that document run alone, in float64 to 1e-9. Boundaries fall inside and on Mamba-3 chunks (16),
// inside the short attention window (32), the DSA local window (16) and the Engram/M2RNN convolution spans.
TEST(Documents, PackedDocumentsGiveTheLogitsTheyGiveAlone) {
  single_threaded();
  torch::manual_seed(0);
  Recipe r = load_recipe(source_path("recipes/tiny-full.json"));
  model::HybridLM m(r, torch::TensorOptions().dtype(torch::kDouble));
  randomize(m, 41);
  const std::vector<std::vector<int64_t>> rows = {{45, 38}, {16, 30, 37}, {2, 1, 80}};
  const int64_t t = 83;
  auto tokens = random_tokens(3, t, r.vocab_size, 5);
  auto docs = model::documents_from_ids(ids_of(rows));
  ASSERT_TRUE(docs.has_value());
  for (auto stage : {model::DsaStage::Sparse, model::DsaStage::Warmup})
    for (bool training : {false, true}) {
      SCOPED_TRACE(std::string(stage == model::DsaStage::Sparse ? "sparse" : "warm-up") +
                   (training ? ", training mode" : ", eval mode"));
      m.set_dsa_stage(stage);
      m.train(training);
      torch::NoGradGuard no_grad;
      auto packed = m.forward(tokens, &*docs);
      auto packed_mtp = m.mtp_logits(tokens, packed.hidden, &*docs);
      ASSERT_EQ(packed_mtp.size(), 1u);
      for (size_t b = 0; b < rows.size(); ++b) {
        int64_t at = 0;
        for (int64_t len : rows[b]) {
          auto doc = tokens.narrow(0, b, 1).narrow(1, at, len);
          auto alone = m.forward(doc);
          EXPECT_LE(max_abs_diff(packed.logits.narrow(0, b, 1).narrow(1, at, len), alone.logits), 1e-9)
              << "row " << b << ", document at " << at;
          if (len > 1) {  // MTP module 1 at position i reads token i+1 of the same document
            auto alone_mtp = m.mtp_logits(doc, alone.hidden);
            EXPECT_LE(max_abs_diff(packed_mtp[0].narrow(0, b, 1).narrow(1, at, len - 1), alone_mtp[0]), 1e-9)
                << "MTP, row " << b << ", document at " << at;
          }
          at += len;
        }
      }
      // The boundaries matter: without them the second document's logits differ.
      auto unpacked = m.forward(tokens);
      EXPECT_GT(max_abs_diff(unpacked.logits.narrow(1, 45, 38).narrow(0, 0, 1),
                             packed.logits.narrow(1, 45, 38).narrow(0, 0, 1)),
                1e-3);
    }
}

// MTP module k at position i predicts token i+k+1 of the window; with doc_ids [B, T+1] the loss keeps only those
// in position i's document. Expected: cross entropy over the hand-listed positions.
TEST(Documents, MtpTargetsDoNotCrossDocuments) {
  single_threaded();
  torch::manual_seed(0);
  auto j = micro_ae_json();  // two MTP modules
  Recipe r = parse(j);
  model::HybridLM m(r, torch::TensorOptions().dtype(torch::kDouble));
  randomize(m, 7);
  const int64_t t = 12;
  auto window = random_tokens(1, t + 1, r.vocab_size, 3);
  auto x = window.narrow(1, 0, t), y = window.narrow(1, 1, t);
  // Document 0 holds window tokens 0..6, document 1 tokens 7..12 (the last target included).
  auto doc_ids = ids_of({{7, 6}});
  auto out = m.loss(x, y, doc_ids);
  auto docs = model::documents_from_ids(doc_ids.narrow(1, 0, t));
  auto fwd = m.forward(x, &*docs);
  auto mtp = m.mtp_logits(x, fwd.hidden, &*docs);
  ASSERT_EQ(out.mtp.size(), 2u);
  for (int64_t k = 1; k <= 2; ++k) {
    // Position i, target token i+k+1: inside document 0 for i+k+1 <= 6, inside document 1 for i >= 7.
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < t - k; ++i)
      if (i + k + 1 <= 6 || i >= 7) kept.push_back(i);
    auto logits = mtp[k - 1][0];
    double nll = 0;
    for (int64_t i : kept) {
      auto row = logits[i];
      nll += (torch::logsumexp(row, 0) - row[y[0][i + k].item<int64_t>()]).item<double>();
    }
    EXPECT_NEAR(out.mtp[k - 1].item<double>(), nll / static_cast<double>(kept.size()), 1e-12) << "module " << k;
  }
  // The main loss keeps every target (the next document's first token follows the last one, as unpacked).
  auto main_nll = torch::nn::functional::cross_entropy(fwd.logits[0], y[0]).item<double>();
  EXPECT_NEAR(out.main.item<double>(), main_nll, 1e-12);
  EXPECT_THROW(m.loss(x, y, doc_ids.narrow(1, 0, t)), Error);  // doc ids cover the window, T+1 tokens
}
