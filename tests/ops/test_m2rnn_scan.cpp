// M2RNN scan: the checkpointed backward against autograd through the plain loop (with and without the
// state-gradient clipping), the decode step against the full scan, and a float64 gradient check.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "ops/gradcheck.h"
#include "ops/mamba3_fixture.h"
#include "slm/ops/m2rnn_scan.h"
#include "slm/util/error.h"

using namespace slm;
using namespace slm::test;

namespace {

struct M2rnnInputs {
  torch::Tensor q, k, v, f, w, d, h0;
  std::vector<torch::Tensor> leaves() const { return {q, k, v, f, w, d, h0}; }
};

M2rnnInputs random_m2rnn(int64_t b, int64_t t, int64_t nh, int64_t kd, int64_t vd, bool requires_grad) {
  auto o = torch::TensorOptions().dtype(torch::kDouble);
  auto leaf = [&](torch::Tensor x) { return x.set_requires_grad(requires_grad); };
  return {leaf(torch::randn({b, t, nh, kd}, o)),
          leaf(torch::randn({b, t, nh, kd}, o) * 0.5),
          leaf(torch::randn({b, t, nh, vd}, o)),
          leaf(torch::rand({b, t, nh}, o) * 0.8 + 0.1),
          leaf(torch::eye(vd, o).expand({nh, vd, vd}) + 0.3 * torch::randn({nh, vd, vd}, o)),
          leaf(torch::randn({nh, vd}, o)),
          leaf(torch::tanh(torch::randn({b, nh, kd, vd}, o)))};
}

// Autograd through the obvious loop; the hook clamps the total gradient of each H_t (the y_t path plus the
// H_{t+1} path, and the final-state path for the last one) before it flows into step t.
std::pair<torch::Tensor, torch::Tensor> naive_scan(const M2rnnInputs& in, double clip) {
  auto h = in.h0;
  std::vector<torch::Tensor> ys;
  for (int64_t t = 0; t < in.q.size(1); ++t) {
    auto f = in.f.select(1, t).unsqueeze(-1).unsqueeze(-1);
    auto kv = in.k.select(1, t).unsqueeze(-1) * in.v.select(1, t).unsqueeze(-2);
    h = f * h + (1 - f) * torch::tanh(h.matmul(in.w) + kv);
    if (clip > 0) h.register_hook([clip](torch::Tensor g) { return g.clamp(-clip, clip); });
    ys.push_back(torch::einsum("bnk,bnkv->bnv", {in.q.select(1, t), h}) + in.d * in.v.select(1, t));
  }
  return {torch::stack(ys, 1), h};
}

void check_backward(double clip, double y_scale) {
  torch::manual_seed(11);
  auto in = random_m2rnn(2, 23, 3, 5, 4, true);
  auto wy = torch::randn({2, 23, 3, 4}, torch::kDouble) * y_scale, wh = torch::randn({2, 3, 5, 4}, torch::kDouble);
  auto loss = [&](const std::pair<torch::Tensor, torch::Tensor>& out) {
    return (out.first * wy).sum() + (out.second * wh).sum();
  };
  auto [y_ref, h_ref] = naive_scan(in, clip);
  auto g_ref = torch::autograd::grad({loss({y_ref, h_ref})}, in.leaves());
  for (int64_t every : {1, 4, 64}) {
    SCOPED_TRACE("checkpoint every " + std::to_string(every));
    auto out = ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w, in.d, in.h0, clip, every);
    EXPECT_LE(max_rel_diff(out.first, y_ref), 1e-12);
    EXPECT_LE(max_rel_diff(out.second, h_ref), 1e-12);
    auto g = torch::autograd::grad({loss(out)}, in.leaves());
    for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(max_rel_diff(g[i], g_ref[i]), 1e-10) << "input " << i;
  }
}

}  // namespace

TEST(M2rnnScan, CheckpointedBackwardMatchesAutograd) { check_backward(0.0, 1.0); }

TEST(M2rnnScan, CheckpointedBackwardMatchesAutogradWithClipping) {
  // Large output weights so that many state gradients exceed 1 and the clipping is exercised.
  check_backward(1.0, 20.0);
  torch::manual_seed(11);
  auto in = random_m2rnn(2, 23, 3, 5, 4, true);
  auto wy = torch::randn({2, 23, 3, 4}, torch::kDouble) * 20.0;
  auto clipped = torch::autograd::grad({(ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w, in.d, in.h0, 1.0, 4).first * wy).sum()}, {in.w});
  auto plain = torch::autograd::grad({(ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w, in.d, in.h0, 0.0, 4).first * wy).sum()}, {in.w});
  EXPECT_GT(max_rel_diff(clipped[0], plain[0]), 1e-3) << "the clip never engaged";
}

TEST(M2rnnScan, Gradcheck) {
  torch::manual_seed(12);
  auto in = random_m2rnn(1, 9, 2, 3, 2, true);
  auto wy = torch::randn({1, 9, 2, 2}, torch::kDouble), wh = torch::randn({1, 2, 3, 2}, torch::kDouble);
  expect_gradcheck(
      [&] {
        auto [y, h] = ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w, in.d, in.h0, 0.0, 4);
        return (y * wy).sum() + (h * wh).sum();
      },
      in.leaves());
}

TEST(M2rnnScan, StepsMatchScan) {
  torch::manual_seed(13);
  auto in = random_m2rnn(2, 40, 3, 5, 4, false);
  auto [y_ref, h_ref] = ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w, in.d, in.h0, 1.0, 16);
  auto h = in.h0;
  for (int64_t t = 0; t < 40; ++t) {
    auto [y, next] = ops::m2rnn_step(in.q.select(1, t), in.k.select(1, t), in.v.select(1, t), in.f.select(1, t), in.w,
                                     in.d, h);
    EXPECT_LE(max_rel_diff(y, y_ref.select(1, t)), 1e-12) << "token " << t;
    h = next;
  }
  EXPECT_LE(max_rel_diff(h, h_ref), 1e-12);
}

TEST(M2rnnScan, RejectsBadShapes) {
  auto in = random_m2rnn(1, 4, 2, 3, 2, false);
  EXPECT_THROW(ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w.narrow(0, 0, 1), in.d, in.h0, 1.0, 4), Error);
  EXPECT_THROW(ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w, in.d, in.h0, 1.0, 0), Error);
}

// Packed documents: a reset starts the token from H = 0. Each document then runs as the plain loop runs it alone
// (the first from h0, the others from zero), outputs and gradients alike, with and without clipping, for
// checkpoint stretches that start before, on and after a reset.
TEST(M2rnnScan, ResetsRunEachDocumentAlone) {
  for (double clip : {0.0, 1.0}) {
    torch::manual_seed(14);
    auto in = random_m2rnn(1, 23, 3, 5, 4, true);
    const std::vector<int64_t> bounds = {0, 7, 8, 15, 23};
    auto reset = torch::zeros({1, 23}, torch::kBool);
    for (size_t i = 1; i + 1 < bounds.size(); ++i) reset[0][bounds[i]] = true;
    auto wy = torch::randn({1, 23, 3, 4}, torch::kDouble) * 10.0, wh = torch::randn({1, 3, 5, 4}, torch::kDouble);
    torch::Tensor loss_ref = torch::zeros({}, torch::kDouble);
    std::vector<torch::Tensor> ys;
    for (size_t d = 0; d + 1 < bounds.size(); ++d) {
      const int64_t from = bounds[d], len = bounds[d + 1] - from;
      auto part = [&](const torch::Tensor& x) { return x.narrow(1, from, len); };
      M2rnnInputs doc{part(in.q), part(in.k), part(in.v), part(in.f), in.w, in.d,
                      d == 0 ? in.h0 : torch::zeros_like(in.h0)};
      auto [y, h] = naive_scan(doc, clip);
      ys.push_back(y);
      loss_ref = loss_ref + (y * part(wy)).sum();
      if (d + 2 == bounds.size()) loss_ref = loss_ref + (h * wh).sum();
    }
    auto g_ref = torch::autograd::grad({loss_ref}, in.leaves());
    for (int64_t every : {1, 4, 64}) {
      SCOPED_TRACE("clip " + std::to_string(clip) + ", checkpoint every " + std::to_string(every));
      auto [y, h] = ops::m2rnn_scan(in.q, in.k, in.v, in.f, in.w, in.d, in.h0, clip, every, reset);
      EXPECT_LE(max_rel_diff(y, torch::cat(ys, 1)), 1e-12);
      auto g = torch::autograd::grad({(y * wy).sum() + (h * wh).sum()}, in.leaves());
      for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(max_rel_diff(g[i], g_ref[i]), 1e-10) << "input " << i;
    }
  }
}
