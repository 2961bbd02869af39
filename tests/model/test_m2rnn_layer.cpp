// The R layer: parameter names against the accounting, initialisation, decode/prefill/rollback == forward
// (conv state included), causality and a float64 gradient check with clipping off.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/recurrent_layer_checks.h"
#include "slm/model/layers/m2rnn.h"
#include "test_util.h"

using namespace slm;
using namespace slm::test;

namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kDouble);

// d_model 16; 4 state heads of K=6, V=3 sharing 2 q/k heads; conv kernel 3.
Recipe m2rnn_recipe() {
  auto j = base_recipe();
  j["m2rnn"] = {{"heads", 4}, {"k_head_dim", 6}, {"v_head_dim", 3}, {"qk_heads", 2}, {"conv_kernel", 3}};
  return parse(j);
}

}  // namespace

TEST(M2RNNLayer, ParametersMatchAccounting) {
  auto r = m2rnn_recipe();
  model::M2RNNLayer layer(r, kF64);
  expect_accounting_names(r, layer, 11);  // ...AEMR: layer 11 is the R
}

TEST(M2RNNLayer, Initialisation) {
  torch::manual_seed(0);
  model::M2RNNLayer layer(m2rnn_recipe(), kF64);
  auto& m = *layer.m2rnn;
  EXPECT_TRUE(torch::equal(m.state_weight, torch::eye(3, kF64).expand({4, 3, 3})));
  EXPECT_TRUE(torch::equal(m.D, torch::ones_like(m.D)));
  EXPECT_LE(m.A_log.max().item<double>(), std::log(16.0));
  auto dt = torch::softplus(m.dt_bias);
  EXPECT_GE(dt.min().item<double>(), 1e-3 * (1 - 1e-9));
  EXPECT_LE(dt.max().item<double>(), 0.1 * (1 + 1e-9));
  EXPECT_EQ(m.out_proj->weight.dense().abs().max().item<double>(), 0.0);
}

TEST(M2RNNLayer, DecodeAndPrefillMatchForward) {
  torch::manual_seed(1);
  model::M2RNNLayer layer(m2rnn_recipe(), kF64);
  randomize(layer);
  expect_decode_matches_forward(layer, 16, 67, 1e-10);
}

TEST(M2RNNLayer, Causal) {
  torch::manual_seed(2);
  model::M2RNNLayer layer(m2rnn_recipe(), kF64);
  randomize(layer);
  expect_causal(layer, 16, 13, 6);
}

TEST(M2RNNLayer, Gradcheck) {
  torch::manual_seed(3);
  model::M2RNNLayer layer(m2rnn_recipe(), kF64);
  randomize(layer);
  layer.m2rnn->grad_clip = 0.0;  // finite differences see the true gradient
  expect_layer_gradcheck(layer, 16, 9);
}
