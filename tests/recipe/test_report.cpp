// recipe/report.h: what `slm recipe show` and `slm ensemble show` print. The recipe, plan, accounting and
// ensemble are written out by hand here (not computed by the planner or the accountant), so each test pins the
// report's own work: which fields appear, under which names, and the exact text layout and number formats.
#include <gtest/gtest.h>

#include <string>

#include "slm/recipe/report.h"

namespace slm {
namespace {

using Json = nlohmann::json;

LayerPlan layer(int index, char declared, char letter, Family family) {
  LayerPlan l;
  l.index = index;
  l.declared = declared;
  l.letter = letter;
  l.family = family;
  return l;
}

// Three layers: full attention, an E slot built as F (moe.layer_freq) with Engram, and short-window attention with
// DSA, MLA and mHC; one MTP module of MLA attention and a dense MLP.
struct Mini {
  Recipe recipe;
  ModelPlan plan;
  Accounting acc;
  Mini() {
    recipe.name = "mini";
    recipe.source = "recipes/mini.json";
    recipe.vocab_size = 512;
    recipe.d_model = 64;
    recipe.depth = 3;
    recipe.pattern = "AE";
    recipe.seq_len = 256;
    recipe.mtp.depth = 1;
    recipe.mtp.lambda = 0.3;

    plan.expanded = "AFA";
    auto a0 = layer(0, 'A', 'A', Family::Attention);
    a0.window = 'L';
    auto f1 = layer(1, 'E', 'F', Family::MLP);
    f1.engram = true;
    auto a2 = layer(2, 'A', 'A', Family::Attention);
    a2.window = 'S';
    a2.window_tokens = 128;
    a2.dsa = a2.mla = a2.mhc = true;
    plan.layers = {a0, f1, a2};
    auto m0 = layer(0, 'A', 'A', Family::Attention);
    m0.window = 'L';
    m0.mla = true;
    plan.mtp_layers = {m0, layer(1, 'F', 'F', Family::MLP)};
    plan.mtp_depth = 1;
    plan.composition = {{'A', 2}, {'F', 1}};

    acc.layers = {{1000, 1000}, {2500, 2500}, {1500000, 250000}};
    acc.total = 1234567;
    acc.active = 345678;
    acc.active_excl_embedding = 312910;
    acc.embedding = 32768;
    acc.mtp_total = 5000;
    acc.mtp_active = 4000;
    acc.engram_tables = 2000000;
    acc.engram_lookups_per_token = 96;
    acc.stored = 3239567;
    acc.by_family = {{"attention", 1000}, {"mlp", 2500}, {"embedding", 32768}};
    acc.bytes_bf16 = 6479134;
    acc.bytes_nvfp4 = 2000000;
  }
};

TEST(RecipeReport, JsonHasEveryLayerAndCount) {
  const Mini m;
  const Json expected = Json::parse(R"({
    "name": "mini", "source": "recipes/mini.json", "vocab_size": 512, "d_model": 64, "depth": 3, "pattern": "AE",
    "expanded": "AFA", "seq_len": 256, "composition": {"A": 2, "F": 1},
    "layers": [
      {"index": 0, "letter": "A", "family": "attention", "window": "L", "window_tokens": 0, "dsa": false,
       "mla": false, "engram": false, "mhc": false, "params": 1000, "active": 1000},
      {"index": 1, "letter": "F", "declared": "E", "family": "mlp", "engram": true, "mhc": false, "params": 2500,
       "active": 2500},
      {"index": 2, "letter": "A", "family": "attention", "window": "S", "window_tokens": 128, "dsa": true,
       "mla": true, "engram": false, "mhc": true, "params": 1500000, "active": 250000}],
    "mtp": {"depth": 1, "lambda": 0.3, "layers": [
      {"index": 0, "letter": "A", "family": "attention", "window": "L", "window_tokens": 0, "dsa": false,
       "mla": true, "engram": false, "mhc": false},
      {"index": 1, "letter": "F", "family": "mlp", "engram": false, "mhc": false}]},
    "params": {"total": 1234567, "active": 345678, "active_excl_embedding": 312910, "embedding": 32768,
               "mtp": 5000, "mtp_active": 4000, "engram_tables": 2000000, "engram_lookups_per_token": 96,
               "stored": 3239567, "by_family": {"attention": 1000, "embedding": 32768, "mlp": 2500}},
    "memory": {"bytes_bf16": 6479134, "bytes_nvfp4": 2000000}})");
  const Json got = recipe_report_json(m.recipe, m.plan, m.acc);
  EXPECT_EQ(got, expected) << got.dump(2);
}

TEST(RecipeReport, TextLayout) {
  const Mini m;
  // Counts: 1234567 -> 1.23M, 345678 -> 346K, 32768 -> 32.8K; bytes: 6479134 B = 6.18 MiB, 2000000 B = 1.91 MiB,
  // their ratio 3.24.
  const std::string expected =
      "recipe   mini  (recipes/mini.json)\n"
      "shape    d_model 64, depth 3, vocab 512, seq_len 256\n"
      "pattern  AE tiled to 3: AFA\n"
      "composition  A 2  F 1\n"
      "\n"
      "layer  letter family         params     active  features\n"
      "    0  A      attention       1.00K      1.00K  window=L\n"
      "    1  F      mlp             2.50K      2.50K  engram (E->F by moe.layer_freq)\n"
      "    2  A      attention       1.50M       250K  window=S:128 dsa mla mhc\n"
      "\n"
      "MTP      1 module(s), lambda 0.3, each: A(attention, mla) F(mlp)\n"
      "\n"
      "parameters\n"
      "  total (main model)          1.23M  (1234567)\n"
      "  active per token            346K  (345678)\n"
      "  active without embedding    313K\n"
      "  MTP modules (separate)      5.00K total, 4.00K active\n"
      "  Engram tables (separate)    2.00M, 96 elements looked up per token\n"
      "  stored in a checkpoint      3.24M\n"
      "  by family:  attention 1.00K  embedding 32.8K  mlp 2.50K\n"
      "memory   BF16 6.18 MiB, NVFP4 1.91 MiB (3.24x smaller)\n";
  EXPECT_EQ(recipe_report_text(m.recipe, m.plan, m.acc), expected);
}

TEST(RecipeReport, NoMtpSectionWithoutMtp) {
  Mini m;
  m.recipe.mtp.depth = 0;
  m.plan.mtp_depth = 0;
  m.plan.mtp_layers.clear();
  const std::string text = recipe_report_text(m.recipe, m.plan, m.acc);
  EXPECT_EQ(text.find("MTP      "), std::string::npos) << text;
  EXPECT_NE(text.find("    2  A      attention       1.50M       250K  window=S:128 dsa mla mhc\n\nparameters\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(recipe_report_json(m.recipe, m.plan, m.acc)["mtp"],
            Json::parse(R"({"depth": 0, "lambda": 0.3, "layers": []})"));
}

Ensemble duo() {
  Ensemble e;
  e.name = "duo";
  e.source = "ensembles/duo.json";
  e.description = "two specialists";
  e.router = "models/router.bin";
  e.router_sha256 = "ab12";
  Specialist cmake;
  cmake.name = "cmake";
  cmake.domain = "build systems";
  cmake.recipe_path = "recipes/cmake.json";
  cmake.checkpoint = "models/cmake.safetensors";
  cmake.sha256 = "deadbeef";
  cmake.tokenizer = "tokenizer/slm-code-8k.model";
  cmake.training_tokens = 123456789;
  cmake.heldout_bpb = 1.23456;
  cmake.target_total = 2e6;
  cmake.target_active = 1e6;
  cmake.accounting.total = 2100000;
  cmake.accounting.active = 950000;
  cmake.accounting.stored = 2200000;
  cmake.accounting.bytes_bf16 = 4400000;
  cmake.accounting.bytes_nvfp4 = 1300000;
  Specialist shell;
  shell.name = "shell";
  shell.domain = "scripts";
  shell.recipe_path = "recipes/shell.json";
  shell.accounting.total = 500000;
  shell.accounting.active = 500000;
  shell.accounting.stored = 520000;
  shell.accounting.bytes_bf16 = 1000000;
  shell.accounting.bytes_nvfp4 = 409600;
  e.specialists = {cmake, shell};
  // The sums are set by hand too: the report prints them, load_ensemble computes them.
  e.total = 2600000;
  e.active = 1450000;
  e.stored = 2720000;
  e.bytes_bf16 = 5400000;
  e.bytes_nvfp4 = 1709600;
  return e;
}

TEST(EnsembleReport, JsonListsOnlyTheFieldsTheManifestGives) {
  const Json expected = Json::parse(R"({
    "name": "duo", "source": "ensembles/duo.json", "router": "models/router.bin", "router_sha256": "ab12",
    "specialists": [
      {"name": "cmake", "domain": "build systems", "recipe": "recipes/cmake.json", "total": 2100000,
       "active": 950000, "stored": 2200000, "bytes_bf16": 4400000, "bytes_nvfp4": 1300000,
       "checkpoint": "models/cmake.safetensors", "sha256": "deadbeef", "tokenizer": "tokenizer/slm-code-8k.model",
       "training_tokens": 123456789, "heldout_bpb": 1.23456, "target": {"total": 2000000, "active": 1000000}},
      {"name": "shell", "domain": "scripts", "recipe": "recipes/shell.json", "total": 500000, "active": 500000,
       "stored": 520000, "bytes_bf16": 1000000, "bytes_nvfp4": 409600}],
    "total": 2600000, "active": 1450000, "stored": 2720000, "bytes_bf16": 5400000, "bytes_nvfp4": 1709600})");
  const Json got = ensemble_report_json(duo());
  EXPECT_EQ(got, expected) << got.dump(2);

  auto bare = duo();
  bare.router.clear();
  bare.router_sha256.clear();
  const Json j = ensemble_report_json(bare);
  EXPECT_FALSE(j.contains("router"));
  EXPECT_FALSE(j.contains("router_sha256"));
}

TEST(EnsembleReport, TextWithProvenance) {
  // 2.1M against a 2M target is +5.00%, 950K against 1M -5.00%; 4400000 B = 4.20 MiB, 1300000 B = 1.24 MiB,
  // 1000000 B = 976.56 KiB, 409600 B = 400.00 KiB; 5400000 / 1709600 = 3.16.
  const std::string expected =
      "ensemble duo  (ensembles/duo.json)\n"
      "two specialists\n"
      "\n"
      "specialist           total    active   vs tgt   vs tgt        BF16       NVFP4  recipe\n"
      "cmake                2.10M      950K   +5.00%   -5.00%    4.20 MiB    1.24 MiB  recipes/cmake.json\n"
      "shell                 500K      500K        -        -  976.56 KiB  400.00 KiB  recipes/shell.json\n"
      "sum                  2.60M     1.45M                      5.15 MiB    1.63 MiB\n"
      "\n"
      "weights include MTP modules and Engram tables (stored 2.72M); NVFP4 packs projections, experts and Engram "
      "tables at 4.5 bits per weight and keeps the rest in BF16: 3.16x smaller than BF16\n"
      "\n"
      "specialist       training tokens held-out bpb  checkpoint (sha256)\n"
      "cmake                  123456789       1.2346  models/cmake.safetensors (deadbeef)\n"
      "shell                          -            -  - (no sha256)\n"
      "router: models/router.bin (ab12)\n";
  EXPECT_EQ(ensemble_report_text(duo()), expected);
}

TEST(EnsembleReport, TextWithoutProvenanceEndsAfterTheSums) {
  auto e = duo();
  e.description.clear();
  e.router.clear();
  e.router_sha256.clear();
  for (auto& sp : e.specialists) {
    sp.checkpoint.clear();
    sp.sha256.clear();
    sp.training_tokens.reset();
    sp.heldout_bpb.reset();
  }
  const std::string expected =
      "ensemble duo  (ensembles/duo.json)\n"
      "\n"
      "specialist           total    active   vs tgt   vs tgt        BF16       NVFP4  recipe\n"
      "cmake                2.10M      950K   +5.00%   -5.00%    4.20 MiB    1.24 MiB  recipes/cmake.json\n"
      "shell                 500K      500K        -        -  976.56 KiB  400.00 KiB  recipes/shell.json\n"
      "sum                  2.60M     1.45M                      5.15 MiB    1.63 MiB\n"
      "\n"
      "weights include MTP modules and Engram tables (stored 2.72M); NVFP4 packs projections, experts and Engram "
      "tables at 4.5 bits per weight and keeps the rest in BF16: 3.16x smaller than BF16\n";
  EXPECT_EQ(ensemble_report_text(e), expected);
  // A router alone brings the provenance table back (which weights answer matters when a router picks them).
  e.router = "r.bin";
  EXPECT_NE(ensemble_report_text(e).find("shell                          -            -  - (no sha256)\n"
                                         "router: r.bin (no sha256)\n"),
            std::string::npos);
}

}  // namespace
}  // namespace slm
