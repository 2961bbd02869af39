// A training micro-batch staged through one pinned buffer (train/device_batch.h) holds what the host's batch holds:
// the inputs, targets and document ids, and the documents as documents_from_ids gives them, or in a CUDA graph's
// padded form. Hand-computed values; on the CPU (the GPU runs the same code with a pinned buffer and an asynchronous
// copy, exercised by the GraphStepCuda and trainer tests there).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "slm/model/documents.h"
#include "slm/train/device_batch.h"
#include "slm/util/error.h"

using namespace slm;

namespace {
torch::Tensor rows(std::vector<int64_t> v, int64_t cols, torch::ScalarType type = torch::kLong) {
  return torch::tensor(v, torch::kLong).view({-1, cols}).to(type);
}
}  // namespace

TEST(DeviceBatch, StagesInputsTargetsAndDocuments) {
  const auto tokens = rows({10, 11, 12, 13, 14, 20, 21, 22, 23, 24}, 5);
  const auto ids = rows({0, 0, 1, 1, 1, 3, 3, 3, 3, 4}, 5, torch::kInt);  // the last column: the targets' documents
  auto b = train::stage_batch(tokens, ids, torch::kCPU);
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(torch::equal(b->x, rows({10, 11, 12, 13, 20, 21, 22, 23}, 4)));
  EXPECT_TRUE(torch::equal(b->y, rows({11, 12, 13, 14, 21, 22, 23, 24}, 4)));
  EXPECT_TRUE(torch::equal(b->window, rows({0, 0, 1, 1, 1, 3, 3, 3, 3, 4}, 5)));
  ASSERT_TRUE(b->docs.has_value());
  const auto& d = *b->docs;
  EXPECT_TRUE(torch::equal(d.start, rows({1, 0, 1, 0, 1, 0, 0, 0}, 4, torch::kBool)));
  EXPECT_TRUE(torch::equal(d.pos, rows({0, 1, 0, 1, 0, 1, 2, 3}, 4)));
  EXPECT_TRUE(torch::equal(d.spans.id, rows({0, 0, 1, 1, 0, 0, 0, 0}, 4)));
  EXPECT_TRUE(torch::equal(d.spans.cu_seqlens, torch::tensor({0, 2, 4, 8}, torch::kInt)));
  EXPECT_EQ(d.spans.max_len, 4);
  EXPECT_EQ(model::count_documents(ids.narrow(1, 0, 4)), 3);

  // A CUDA graph's form: padded with empty documents to 5 + 1 entries, max_len the row length.
  auto padded = train::stage_batch(tokens, ids, torch::kCPU, 5);
  ASSERT_TRUE(padded.has_value() && padded->docs.has_value());
  EXPECT_TRUE(torch::equal(padded->docs->spans.cu_seqlens, torch::tensor({0, 2, 4, 8, 8, 8}, torch::kInt)));
  EXPECT_TRUE(torch::equal(padded->docs->pos, d.pos));
  EXPECT_EQ(padded->docs->spans.max_len, 4);
  EXPECT_FALSE(train::stage_batch(tokens, ids, torch::kCPU, 2).has_value()) << "3 documents, room for 2";
}

TEST(DeviceBatch, RowsOfOneDocumentHaveDocumentsOnlyInTheGraphsForm) {
  const auto tokens = rows({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 5);
  const auto ids = rows({5, 5, 5, 5, 6, 0, 0, 0, 0, 0}, 5, torch::kInt);  // a change only at the last target
  auto b = train::stage_batch(tokens, ids, torch::kCPU);
  ASSERT_TRUE(b.has_value());
  EXPECT_FALSE(b->docs.has_value()) << "the unpacked path, as documents_from_ids";
  EXPECT_FALSE(model::documents_from_ids(ids.narrow(1, 0, 4)).has_value());
  auto g = train::stage_batch(tokens, ids, torch::kCPU, 4);
  ASSERT_TRUE(g.has_value() && g->docs.has_value());
  EXPECT_TRUE(torch::equal(g->docs->spans.cu_seqlens, torch::tensor({0, 4, 8, 8, 8}, torch::kInt)));
  EXPECT_TRUE(torch::equal(g->docs->start, rows({1, 0, 0, 0, 1, 0, 0, 0}, 4, torch::kBool)));
  EXPECT_EQ(g->docs->spans.max_len, 4);
}

TEST(DeviceBatch, RefusesMismatchedShapes) {
  const auto tokens = rows({1, 2, 3, 4, 5, 6}, 3);
  EXPECT_THROW(train::stage_batch(tokens.to(torch::kInt), torch::zeros({2, 3}, torch::kInt), torch::kCPU), Error);
  EXPECT_THROW(train::stage_batch(tokens, torch::zeros({2, 2}, torch::kInt), torch::kCPU), Error);
  EXPECT_THROW(train::stage_batch(tokens.narrow(1, 0, 1), torch::zeros({2, 1}, torch::kInt), torch::kCPU), Error);
}
