// The M layer: parameter names against the accounting, initialisation, decode/prefill/rollback == forward,
// causality and a float64 gradient check through the chunked path, for SISO and MIMO.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/recurrent_layer_checks.h"
#include "slm/model/layers/mamba3.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// d_model 16, expand 2, headdim 8: 4 heads of width 8; 2 B/C groups; chunks of 4 tokens.
Recipe mamba3_recipe(bool mimo) {
  auto j = base_recipe();
  j["mamba3"] = {{"d_state", 8}, {"expand", 2}, {"headdim", 8}, {"ngroups", 2}, {"chunk_size", 4}};
  if (mimo) {
    j["mamba3"]["is_mimo"] = true;
    j["mamba3"]["mimo_rank"] = 2;
    j["mamba3"]["is_outproj_norm"] = true;
    j["mamba3"]["rope_fraction"] = 1.0;
  }
  return parse(j);
}

}  // namespace

TEST(Mamba3Layer, ParametersMatchAccounting) {
  for (bool mimo : {false, true}) {
    auto r = mamba3_recipe(mimo);
    model::Mamba3Layer layer(r, kF64);
    expect_accounting_names(r, layer, 2);  // AEM...: layer 2 is the first M
  }
}

TEST(Mamba3Layer, Initialisation) {
  auto r = mamba3_recipe(true);
  torch::manual_seed(0);
  model::Mamba3Layer layer(r, kF64);
  auto& m = *layer.mamba;
  auto dt = torch::softplus(m.dt_bias);
  EXPECT_GE(dt.min().item<double>(), r.mamba3->dt_min * (1 - 1e-9));
  EXPECT_LE(dt.max().item<double>(), r.mamba3->dt_max * (1 + 1e-9));
  EXPECT_TRUE(torch::equal(m.B_bias, torch::ones_like(m.B_bias)));
  EXPECT_TRUE(torch::equal(m.C_bias, torch::ones_like(m.C_bias)));
  EXPECT_TRUE(torch::equal(m.D, torch::ones_like(m.D)));
  EXPECT_TRUE(torch::allclose(m.mimo_x, torch::full_like(m.mimo_x, 0.5)));
  EXPECT_TRUE(torch::equal(m.mimo_z, torch::ones_like(m.mimo_z)));
  EXPECT_TRUE(torch::allclose(m.mimo_o, torch::full_like(m.mimo_o, 0.5)));
  EXPECT_EQ(m.out_proj->weight.abs().max().item<double>(), 0.0);
}

TEST(Mamba3Layer, DecodeAndPrefillMatchForward) {
  for (bool mimo : {false, true}) {
    SCOPED_TRACE(mimo ? "MIMO" : "SISO");
    torch::manual_seed(1);
    model::Mamba3Layer layer(mamba3_recipe(mimo), kF64);
    randomize(layer);
    expect_decode_matches_forward(layer, 16, 67, 1e-9);
  }
}

TEST(Mamba3Layer, Causal) {
  for (bool mimo : {false, true}) {
    torch::manual_seed(2);
    model::Mamba3Layer layer(mamba3_recipe(mimo), kF64);
    randomize(layer);
    expect_causal(layer, 16, 13, 6);
  }
}

TEST(Mamba3Layer, Gradcheck) {
  for (bool mimo : {false, true}) {
    SCOPED_TRACE(mimo ? "MIMO" : "SISO");
    torch::manual_seed(3);
    model::Mamba3Layer layer(mamba3_recipe(mimo), kF64);
    randomize(layer);
    expect_layer_gradcheck(layer, 16, 11);  // 3 chunks of 4, the last one partial
  }
}
