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
#include "slm/ops/attention.h"

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
  EXPECT_TRUE(
      torch::equal(d->spans.id, torch::tensor({0, 0, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0}, torch::kLong).view({2, 6})));
  EXPECT_TRUE(torch::equal(d->spans.cu_seqlens, torch::tensor({0, 2, 5, 6, 12}, torch::kInt)));
  EXPECT_EQ(d->spans.max_len, 6);
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

// Without a gradient (inference: a prefill, the engine's batched first chunks) plain causal attention takes the flash
// kernel too, which has no per-shape plan to build: for every batch size it equals the float64 reference, GQA and a
// window included.
TEST(Documents, InferenceCausalAttentionTakesFlashForAnyBatchOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  const int64_t h = 8, kv = 4, t = 40, hd = 64;
  for (int64_t b : {1, 3, 7})
    for (int64_t window : {0, 16}) {
      SCOPED_TRACE("batch " + std::to_string(b) + ", window " + std::to_string(window));
      auto bf = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
      auto q = torch::randn({b, h, t, hd}, bf), k = torch::randn({b, kv, t, hd}, bf),
           v = torch::randn({b, kv, t, hd}, bf);
      auto out = ops::causal_attention(q, k, v, window, std::nullopt, nullptr);
      auto ref = ops::causal_attention_ref(q.cpu().to(torch::kDouble), k.cpu().to(torch::kDouble),
                                           v.cpu().to(torch::kDouble), window, std::nullopt, nullptr);
      EXPECT_LT(max_abs_diff(out.cpu(), ref), 2e-2);
    }
}

// On CUDA in BF16, packed documents and windows take flash attention's variable-length form: it equals the masked
// float64 reference on the same (BF16-rounded) inputs, forward and gradients, GQA included.
TEST(Documents, FlashAttentionMatchesTheMaskedReferenceOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(4);
  const int64_t b = 3, h = 4, kv = 2, t = 70, hd = 32;
  auto docs = model::documents_from_ids(ids_of({{45, 25}, {16, 30, 24}, {2, 1, 67}}));
  ASSERT_TRUE(docs.has_value());
  auto on_gpu = model::to_device(*docs, torch::kCUDA);
  // A CUDA graph's form (train/graph_step.h): 12 empty documents after the batch's 8, max_len the row length.
  auto padded = *docs;
  padded.spans.cu_seqlens = torch::cat({docs->spans.cu_seqlens, torch::full({12}, b * t, torch::kInt)});
  padded.spans.max_len = t;
  padded = model::to_device(padded, torch::kCUDA);
  for (int form : {0, 1, 2})  // packed, padded, one document per row
    for (int64_t window : {0, 5, 40}) {
      const bool packed = form < 2;
      if (!packed && window == 0) continue;  // plain causal SDPA, not the flash path under test
      SCOPED_TRACE("form " + std::to_string(form) + ", window " + std::to_string(window));
      auto bf = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
      auto q = torch::randn({b, h, t, hd}, bf).requires_grad_(), k = torch::randn({b, kv, t, hd}, bf).requires_grad_();
      auto v = torch::randn({b, kv, t, hd}, bf).requires_grad_();
      auto w = torch::randn({b, h, t, hd}, torch::kDouble);
      auto out = ops::causal_attention(q, k, v, window, std::nullopt,
                                       form == 0   ? &on_gpu.spans
                                       : form == 1 ? &padded.spans
                                                   : nullptr);
      auto g = torch::autograd::grad({(out.to(torch::kDouble).cpu() * w).sum()}, {q, k, v});
      auto q64 = q.detach().cpu().to(torch::kDouble).requires_grad_(),
           k64 = k.detach().cpu().to(torch::kDouble).requires_grad_();
      auto v64 = v.detach().cpu().to(torch::kDouble).requires_grad_();
      auto ref = ops::causal_attention_ref(q64, k64, v64, window, std::nullopt, packed ? &docs->spans : nullptr);
      auto g_ref = torch::autograd::grad({(ref * w).sum()}, {q64, k64, v64});
      EXPECT_LT(max_abs_diff(out.cpu(), ref), 2e-2);
      for (int i = 0; i < 3; ++i)
        EXPECT_LT(max_abs_diff(g[i].cpu(), g_ref[i]), 5e-2 * std::max(1.0, g_ref[i].abs().max().item<double>()))
            << "gradient " << i;
    }
}
