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
  EXPECT_EQ(m.out_proj->weight.dense().abs().max().item<double>(), 0.0);
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

// The backend follows the device and dtype, as the table in Mamba3Impl::pick reads (the CPU here): the fused decode
// step for SISO layers in FP32, the reference step in FP64 and for MIMO; the chunked scan for sequences (the fused
// scan is CUDA's). Training and inference share it (a call that needs a gradient steps by the reference).
TEST(Mamba3Layer, PicksItsBackendFromDeviceAndDtype) {
  model::Mamba3Layer siso(mamba3_recipe(false), torch::TensorOptions());
  EXPECT_STREQ(siso.mamba->backend().name(), "mamba3.chunked+fused_step");
  siso.to(torch::kDouble);
  EXPECT_STREQ(siso.mamba->backend().name(), "mamba3.chunked+step");
  siso.to(torch::kFloat);
  EXPECT_STREQ(siso.mamba->backend().name(), "mamba3.chunked+fused_step");
  model::Mamba3Layer mimo(mamba3_recipe(true), torch::TensorOptions());
  EXPECT_STREQ(mimo.mamba->backend().name(), "mamba3.chunked+step");
  siso.mamba->force_backend(model::Mamba3Backend{model::Mamba3Backend::Scan::Sequential});
  EXPECT_STREQ(siso.mamba->backend().name(), "mamba3.sequential+step");
}

// Every backend computes the same layer: the chunked scan and the reference step against the sequential recurrence
// in FP64 (a sequence with packed documents, then decode tokens from its state), and the fused step against the
// reference step in FP32.
TEST(Mamba3Layer, EveryBackendComputesTheSameLayer) {
  using B = model::Mamba3Backend;
  auto diff = [](const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); };
  torch::NoGradGuard no_grad;
  for (bool mimo : {false, true}) {
    SCOPED_TRACE(mimo ? "MIMO" : "SISO");
    torch::manual_seed(4);
    model::Mamba3Layer layer(mamba3_recipe(mimo), kF64);
    randomize(layer);
    layer.eval();
    auto& m = *layer.mamba;
    auto h = torch::randn({2, 11, 16}, kF64);
    auto start = torch::zeros({2, 11}, torch::kBool);
    start.index_put_({1, 6}, true);  // a second document in row 1
    auto token = torch::randn({2, 1, 16}, kF64);
    auto run = [&](B backend) {
      m.force_backend(backend);
      auto [y, state] = m.forward(h, m.zero_state(2), start);
      auto [y1, next] = m.forward(token, state);
      return std::pair{y, y1};
    };
    const auto ref = run(B{B::Scan::Sequential, B::Step::Reference});
    const auto chunked = run(B{B::Scan::Chunked, B::Step::Reference});
    EXPECT_GT(ref.first.abs().max().item<double>(), 1e-3) << "the layer computes nothing";
    EXPECT_LT(diff(chunked.first, ref.first), 1e-10);
    EXPECT_LT(diff(chunked.second, ref.second), 1e-10);
    if (mimo) continue;  // the fused step takes SISO layers
    layer.to(torch::kFloat);
    auto state = m.forward(h.to(torch::kFloat), m.zero_state(2)).second;
    for (auto* t : state.tensors()) *t = t->contiguous();  // the scan's state may be views; the kernel reads dense
    m.force_backend(B{B::Scan::Chunked, B::Step::Reference});
    auto reference = m.forward(token.to(torch::kFloat), state).first;
    m.force_backend(B{B::Scan::Chunked, B::Step::Fused});
    ASSERT_TRUE(ops::mamba3_step_fusable(m.in_proj(token.to(torch::kFloat)).view({2, -1}), m.weights(), state))
        << "the fused step would not run";
    auto fused = m.forward(token.to(torch::kFloat), state).first;
    EXPECT_LT(diff(fused, reference), 1e-5);
  }
}
