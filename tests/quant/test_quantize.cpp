// Checkpoint quantization: which tensors go to NVFP4 (against the recipe's parameter kinds), sizes, errors,
// --keep-bf16, and the `slm quantize` command end to end on a random checkpoint of the tiny test recipe.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "slm/io/safetensors.h"
#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_store.h"
#include "slm/quant/quantize_checkpoint.h"
#include "slm/recipe/accounting.h"
#include "test_util.h"

namespace nv = slm::nvfp4;
using slm::test::CliResult;
using slm::test::run_slm;

namespace {

// A random BF16 checkpoint with every tensor the small test recipe declares (names and shapes from accounting),
// plus an FP32 buffer as the model saves them (MoE balancing bias), and the recipe as a file for the command.
struct Ckpt {
  std::string path, recipe_path;
  slm::Recipe recipe;
  std::vector<slm::ParamSpec> specs;
  std::map<std::string, torch::Tensor> tensors;
};

const char* kBuffer = "layers.1.moe.expert_bias";

Ckpt random_checkpoint(const std::string& name) {
  Ckpt c;
  c.recipe_path = testing::TempDir() + "/" + name + "_recipe.json";
  std::ofstream(c.recipe_path) << slm::test::base_recipe().dump(2);
  c.recipe = slm::load_recipe(c.recipe_path);
  c.specs = slm::account(c.recipe, slm::make_plan(c.recipe)).params;
  c.path = testing::TempDir() + "/" + name + ".safetensors";
  torch::manual_seed(3);
  for (const auto& p : c.specs) {
    std::vector<int64_t> shape(p.shape.begin(), p.shape.end());
    c.tensors[p.name] = (torch::randn(shape) * 0.05).to(torch::kBFloat16);
  }
  c.tensors[kBuffer] = torch::randn({4});
  slm::safetensors::save(c.path, c.tensors, {{"recipe", "t"}});
  return c;
}

}  // namespace

TEST(Quantize, LinearAndExpertWeightsGoToNvfp4AndTheRestStaysBf16) {
  Ckpt c = random_checkpoint("q_rules");
  std::string out = testing::TempDir() + "/q_rules_nvfp4.safetensors";
  nv::QuantizeReport rep = nv::quantize_checkpoint(c.path, out, c.recipe, {});
  nv::Checkpoint q = nv::load_checkpoint(out);
  EXPECT_EQ(q.metadata.at("recipe"), "t");
  int64_t n_quant = 0;
  for (const auto& p : c.specs) {
    SCOPED_TRACE(p.name);
    // The kinds accounting sizes as NVFP4 (nvfp4_bytes) are exactly the ones written as NVFP4.
    const bool want =
        p.kind == slm::ParamKind::Linear || p.kind == slm::ParamKind::Expert || p.kind == slm::ParamKind::Table;
    EXPECT_EQ(q.quantized.count(p.name), want ? 1u : 0u) << slm::kind_name(p.kind);
    EXPECT_EQ(q.dense.count(p.name), want ? 0u : 1u);
    if (want) {
      ++n_quant;
      EXPECT_EQ(q.quantized.at(p.name).storage_bytes(), slm::nvfp4_bytes(p));
    } else {
      EXPECT_EQ(q.dense.at(p.name).scalar_type(), torch::kBFloat16);
    }
    if (p.kind == slm::ParamKind::Embedding || p.kind == slm::ParamKind::Norm || p.kind == slm::ParamKind::Router) {
      EXPECT_TRUE(q.dense.count(p.name));
    }
  }
  EXPECT_GT(n_quant, 5);
  EXPECT_EQ(rep.total.quantized, n_quant);
  EXPECT_EQ(rep.total.tensors, static_cast<int64_t>(c.specs.size()) + 1);
  ASSERT_TRUE(q.dense.count(kBuffer));  // not a recipe parameter: stays dense
  EXPECT_TRUE(torch::equal(q.dense.at(kBuffer), c.tensors.at(kBuffer).to(torch::kBFloat16)));
  // Quantized values: relative RMS error of Gaussian weights in NVFP4 is about 0.08-0.1.
  slm::safetensors::File src = slm::safetensors::load(c.path);
  double e2 = 0, r2 = 0;
  for (const auto& [name, qt] : q.quantized) {
    torch::Tensor x = src.tensors.at(name).to(torch::kDouble);
    torch::Tensor d = nv::dequantize(qt, torch::kDouble);
    EXPECT_EQ(nv::dequantize(qt).scalar_type(), torch::kBFloat16);
    e2 += (x - d).pow(2).sum().item<double>();
    r2 += x.pow(2).sum().item<double>();
  }
  EXPECT_LT(std::sqrt(e2 / r2), 0.12);
  EXPECT_NEAR(rep.total.rel_rms(), std::sqrt(e2 / r2), 1e-6);
  // Dense tensors are unchanged.
  for (const auto& [name, t] : q.dense) EXPECT_TRUE(torch::equal(t, src.tensors.at(name).to(t.scalar_type()))) << name;
  // Sizes: a quantized matrix whose rows fill whole blocks is >= 3.5x smaller than BF16 (32 bytes -> 9 per block,
  // plus 4 per matrix); this test recipe's narrow rows (K = 8) are padded to a block, as nvfp4_bytes() counted above.
  int64_t full_blocks = 0;
  for (const auto& [name, qt] : q.quantized)
    if (qt.k() % 16 == 0 && qt.numel() / qt.matrices() >= 1024) {
      ++full_blocks;
      EXPECT_GE(2.0 * qt.numel() / qt.storage_bytes(), 3.5) << name;
    }
  EXPECT_GT(full_blocks, 0);  // the check above ran
  EXPECT_EQ(rep.total.bytes_out, [&] {
    int64_t b = 0;
    for (const auto& [n, t] : q.dense) b += t.numel() * 2;
    for (const auto& [n, qt] : q.quantized) b += qt.storage_bytes();
    return b;
  }());
}

TEST(Quantize, KeepBf16PatternsAndPassThrough) {
  Ckpt c = random_checkpoint("q_keep");
  std::string out = testing::TempDir() + "/q_keep_nvfp4.safetensors";
  nv::quantize_checkpoint(c.path, out, c.recipe, {"layers.0.*", "*.w2*"});
  nv::Checkpoint q = nv::load_checkpoint(out);
  for (const auto& [name, qt] : q.quantized) {
    EXPECT_NE(name.rfind("layers.0.", 0), 0u) << name;
    EXPECT_EQ(name.find(".w2"), std::string::npos) << name;
  }
  EXPECT_FALSE(q.quantized.empty());
  // Quantizing an NVFP4 checkpoint again keeps its NVFP4 tensors bit for bit.
  std::string again = testing::TempDir() + "/q_keep_again.safetensors";
  nv::quantize_checkpoint(out, again, c.recipe, {});
  nv::Checkpoint q2 = nv::load_checkpoint(again);
  for (const auto& [name, qt] : q.quantized) EXPECT_TRUE(torch::equal(q2.quantized.at(name).codes, qt.codes)) << name;
}

TEST(Quantize, CommandPrintsTheFamilyTableAndTotals) {
  Ckpt c = random_checkpoint("q_cli");
  std::string out = testing::TempDir() + "/q_cli_nvfp4.safetensors";
  const std::string recipe = " --recipe " + c.recipe_path;
  CliResult r = run_slm("quantize" + recipe + " --in " + c.path + " --out " + out + " --keep-bf16 '*.wo.weight'");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"family", "attention", "moe_experts", "embedding", "norm", "router", "total", "rel RMS"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  r = run_slm("quantize" + recipe + " --in " + c.path + " --out " + out + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["total"]["quantized"].get<int>(), 0);
  EXPECT_GT(j["families"]["moe_experts"]["ratio_vs_bf16"].get<double>(), 1.5);  // tiny shapes: 16-wide rows
  EXPECT_EQ(j["families"]["embedding"]["quantized"], 0);
  EXPECT_EQ(j["families"]["lm_head"]["quantized"], 0);  // the head stays BF16 unless asked
  r = run_slm("quantize" + recipe + " --in " + c.path + " --out " + out + " --json --quantize-head");
  ASSERT_EQ(r.code, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["families"]["lm_head"]["quantized"], 1);
  EXPECT_EQ(j["families"]["embedding"]["quantized"], 0);
  EXPECT_EQ(nv::load_checkpoint(out).quantized.count("lm_head.weight"), 1u);
  r = run_slm("quantize" + recipe + " --in " + testing::TempDir() + "/missing.safetensors --out " + out);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("missing.safetensors"), std::string::npos) << r.out;
}

TEST(Quantize, CheckpointMustMatchTheRecipe) {
  Ckpt c = random_checkpoint("q_mismatch");
  std::string out = testing::TempDir() + "/q_mismatch_nvfp4.safetensors";
  auto expect_refused = [&](const std::map<std::string, torch::Tensor>& tensors, const std::string& fragment) {
    std::string in = testing::TempDir() + "/q_mismatch_in.safetensors";
    slm::safetensors::save(in, tensors);
    try {
      nv::quantize_checkpoint(in, out, c.recipe, {});
      ADD_FAILURE() << "expected an error containing: " << fragment;
    } catch (const slm::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto missing = c.tensors;
  missing.erase("layers.2.mamba.in_proj.weight");
  expect_refused(missing, "tensor layers.2.mamba.in_proj.weight is missing");
  auto reshaped = c.tensors;
  reshaped["layers.1.moe.experts.w2"] = torch::zeros({4, 16, 9});
  expect_refused(reshaped, "tensor layers.1.moe.experts.w2 has shape [4, 16, 9], recipe " + c.recipe_path +
                               " declares [4, 16, 8]");
}
