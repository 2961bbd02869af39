// The log line of what a model's layers run (model/backend_summary.h): each backend once, in layer order, with its
// count, following the dtype. spec-hybrid (AMERAF and two MTP modules of pattern AM) has three Mamba-3 mixers and one
// MoE layer.
#include <gtest/gtest.h>

#include "model_test_util.h"
#include "slm/model/backend_summary.h"

using namespace slm;
using namespace slm::test;

TEST(BackendSummary, NamesEachLayersBackendOnceWithItsCount) {
  auto m = random_model(spec_hybrid_json(), 1);
  EXPECT_EQ(model::backend_summary(*m), "mamba3.chunked+fused_step x3; moe.loop x1");
  m->to(torch::kDouble);
  EXPECT_EQ(model::backend_summary(*m), "mamba3.chunked+step x3; moe.loop x1");
  auto dense = random_model(nlohmann::json::parse(R"({
    "name": "af", "vocab_size": 13, "d_model": 8, "depth": 2, "pattern": "AF", "seq_len": 16,
    "attention": {"heads": 2, "kv_heads": 1, "head_dim": 4}, "mlp": {"hidden": 6}
  })"),
                            1);
  EXPECT_EQ(model::backend_summary(*dense), "one form per layer");
}
