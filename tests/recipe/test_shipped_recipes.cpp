// Every recipe and manifest the repository ships parses, and the full-size ones have their documented sizes.
#include <cmath>
#include <filesystem>

#include "slm/recipe/accounting.h"
#include "recipe/shipped_recipes.h"
#include "slm/recipe/ensemble.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;
namespace fs = std::filesystem;

namespace {

Accounting account_file(const std::string& path) {
  Recipe r = load_recipe(path);
  return account(r, make_plan(r));
}

}  // namespace

TEST(ShippedRecipes, AllParseAndValidate) {
  auto files = shipped_recipes();
  EXPECT_GE(files.size(), 16u);
  for (const auto& f : files) EXPECT_NO_THROW(load_recipe(f)) << f;
}

TEST(ShippedRecipes, Nam56rMatchesTheDocuments) {
  Recipe r = load_recipe(source_path("recipes/nam56r.json"));
  ModelPlan p = make_plan(r);
  Accounting a = account(r, p);
  EXPECT_EQ(r.d_model, 4096);
  EXPECT_EQ(r.vocab_size, 65536);
  EXPECT_EQ(p.composition['A'], 13);
  EXPECT_EQ(p.composition['E'], 22);
  EXPECT_EQ(p.composition['M'], 13);
  EXPECT_EQ(p.composition['R'], 4);
  // The dimensions nam56r_by_hand() multiplies out (shipped_recipes.h): a changed recipe fails here first.
  EXPECT_EQ(r.depth, 52);
  EXPECT_EQ(r.attention->heads, 32);
  EXPECT_EQ(r.attention->kv_heads, 8);
  EXPECT_EQ(r.attention->head_dim, 128);
  EXPECT_EQ(r.attention->dsa_indexer_heads, 32);
  EXPECT_EQ(r.attention->dsa_indexer_dim, 64);
  EXPECT_EQ(r.moe->routed_experts, 16);
  EXPECT_EQ(r.moe->experts_per_token, 4);
  EXPECT_EQ(r.moe->expert_hidden, 352);
  EXPECT_EQ(r.moe->shared_expert_hidden, 1024);
  EXPECT_EQ(r.mamba3->d_state, 128);
  EXPECT_EQ(r.mamba3->heads, 128);
  EXPECT_EQ(r.mamba3->mimo_rank, 4);
  EXPECT_EQ(r.m2rnn->heads, 128);
  EXPECT_EQ(r.mlp->hidden, 21504);
  EXPECT_EQ(r.engram.table_rows, 500000);
  EXPECT_EQ(r.mhc.streams, 4);
  // Exact counts, hand-computed: 4.732B total (the documents' 4.73B); "3.03B active" in the documents reads as the
  // active count without the input embedding and the LM head (3.053B).
  constexpr auto hand = nam56r_by_hand();
  EXPECT_EQ(a.total, hand.total);
  EXPECT_EQ(a.active_excl_embedding - a.by_family.at("lm_head"), hand.active_without_embeddings);
  EXPECT_EQ(a.mtp_total, hand.mtp);
  EXPECT_EQ(a.engram_tables, hand.engram_tables);
  EXPECT_EQ(a.stored, hand.total + hand.mtp + hand.engram_tables);
  int dsa = 0, mla = 0;
  for (const auto& l : p.layers) dsa += l.dsa, mla += l.mla;
  EXPECT_EQ(dsa, 9);
  EXPECT_EQ(mla, 4);
  EXPECT_EQ(p.mtp_depth, 2);
}

TEST(ShippedRecipes, TinyRecipesAreTiny) {
  for (const auto& f : shipped_recipes()) {
    if (fs::path(f).filename().string().rfind("tiny-", 0) != 0) continue;
    long long total = account_file(f).total;
    EXPECT_GE(total, 100'000) << f;
    EXPECT_LE(total, 10'000'000) << f;
  }
}

TEST(ShippedRecipes, SingleGpuHybridIsMidSized) {
  long long total = account_file(source_path("recipes/hybrid-250m.json")).total;
  EXPECT_GE(total, 100'000'000);
  EXPECT_LE(total, 300'000'000);
}

TEST(ShippedRecipes, SpecialistsWithinFivePercentOfStatedSizes) {
  for (const char* m : {"recipes/ensembles/product.json", "recipes/ensembles/topical.json"}) {
    Ensemble e = load_ensemble(source_path(m));
    EXPECT_EQ(e.specialists.size(), 8u) << m;
    for (const auto& s : e.specialists) {
      ASSERT_GT(s.target_total, 0) << s.name;
      EXPECT_NEAR(s.accounting.total / s.target_total, 1.0, 0.05) << m << " " << s.name;
      EXPECT_NEAR(s.accounting.active / s.target_active, 1.0, 0.05) << m << " " << s.name;
      // Fine-grained MoE with one shared expert and top-6 routing, as the product page states.
      EXPECT_EQ(s.recipe.moe->experts_per_token, 6) << s.name;
      EXPECT_EQ(s.recipe.moe->shared_experts, 1) << s.name;
    }
  }
}

TEST(ShippedRecipes, SpecialistCheckpointsShrinkAtLeast3xInNvfp4) {
  // Issue 8's goal for whole checkpoints. NAM56R misses it (2.8x: its 65536x4096 embedding and LM head stay
  // BF16); the specialists, with d_model 1536-2048, meet it.
  for (const char* m : {"recipes/ensembles/product.json", "recipes/ensembles/topical.json"})
    for (const auto& s : load_ensemble(source_path(m)).specialists)
      EXPECT_GE(static_cast<double>(s.accounting.bytes_bf16) / s.accounting.bytes_nvfp4, 3.0) << s.name;
}

TEST(Ensemble, SumsAreSumsOfSpecialists) {
  Ensemble e = load_ensemble(source_path("recipes/ensembles/product.json"));
  // The manifest's eight specialists, each read here from its own recipe file (recipes/specialists/<name>.json, as
  // the manifest names them) and counted on its own: the ensemble's sums must be the sums of these, and must show the
  // README's figures for the lineup (54.4B total, 32.8 GiB in NVFP4).
  const std::vector<std::string> names = {"cpp",           "cmake",  "debug",  "shell",
                                          "orchestration", "design", "review", "algorithm"};
  ASSERT_EQ(e.specialists.size(), names.size());
  long long total = 0, active = 0, stored = 0, bf16 = 0, nvfp4 = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(e.specialists[i].name, names[i]);
    const Accounting a = account_file(source_path("recipes/specialists/" + names[i] + ".json"));
    total += a.total, active += a.active, stored += a.stored, bf16 += a.bytes_bf16, nvfp4 += a.bytes_nvfp4;
  }
  EXPECT_EQ(e.total, total);
  EXPECT_EQ(e.active, active);
  EXPECT_EQ(e.stored, stored);
  EXPECT_EQ(e.bytes_bf16, bf16);
  EXPECT_EQ(e.bytes_nvfp4, nvfp4);
  EXPECT_EQ(std::llround(e.total / 1e8), 544) << e.total;
  EXPECT_EQ(std::llround(e.bytes_nvfp4 / double(1LL << 30) * 10), 328) << e.bytes_nvfp4;
}
