// ops::decode_attention (one query token per row over a cache filled to a per-row device length) against a float64
// loop written out here: scores, the window's first key, grouped heads, rows of different lengths. The CPU form runs
// everywhere; the CUDA kernel (split keys, FP32/BF16) runs on the GPU machine's full ctest.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "slm/ops/decode_attention.h"
#include "slm/util/error.h"

using namespace slm;

namespace {

// out[b, h] = Σ_j softmax_j(scale q·k_j) v_j over keys max(0, len - window) .. len - 1 of kv head h / (H / KV),
// only those with keep[b][j] when keep is given.
torch::Tensor loop_reference(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                             const std::vector<int64_t>& lengths, int64_t window, const torch::Tensor& keep_in = {}) {
  const auto keep = keep_in.defined() ? keep_in.cpu() : torch::Tensor();
  auto q = q_in.cpu().to(torch::kDouble), k = k_in.cpu().to(torch::kDouble), v = v_in.cpu().to(torch::kDouble);
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2), group = h / k.size(1);
  auto out = torch::zeros({b, h, d}, torch::kDouble);
  auto qa = q.accessor<double, 3>();
  auto ka = k.accessor<double, 4>(), va = v.accessor<double, 4>();
  auto oa = out.accessor<double, 3>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t r = 0; r < b; ++r)
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t kv = hh / group, len = lengths[r];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      std::vector<double> s;
      double m = -INFINITY;
      for (int64_t j = first; j < len; ++j) {
        if (keep.defined() && !keep[r][j].item<bool>()) {
          s.push_back(-INFINITY);
          continue;
        }
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += qa[r][hh][i] * ka[r][kv][j][i];
        s.push_back(dot * scale);
        m = std::max(m, s.back());
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - m));
      for (int64_t j = first; j < len; ++j)
        for (int64_t i = 0; i < d; ++i) oa[r][hh][i] += s[j - first] / z * va[r][kv][j][i];
    }
  return out;
}

struct Case {
  int64_t b, h, kv, d, cap, window;
  std::vector<int64_t> lengths;
};

double max_rel(const torch::Tensor& out, const torch::Tensor& ref) {
  return (out.cpu().to(torch::kDouble) - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

void check(const Case& c, const torch::Device& device, torch::ScalarType dtype, double tol) {
  torch::manual_seed(c.b * 131 + c.cap);
  auto o = torch::TensorOptions().dtype(dtype).device(device);
  auto q = torch::randn({c.b, c.h, c.d}, o), k = torch::randn({c.b, c.kv, c.cap, c.d}, o),
       v = torch::randn({c.b, c.kv, c.cap, c.d}, o);
  auto len = torch::tensor(c.lengths, torch::kLong).to(device);
  auto out = ops::decode_attention(q, k, v, len, c.window);
  EXPECT_EQ(out.device().type(), device.type());
  EXPECT_EQ(out.scalar_type(), dtype);
  EXPECT_LE(max_rel(out, loop_reference(q, k, v, c.lengths, c.window)), tol)
      << "b " << c.b << " h " << c.h << " kv " << c.kv << " d " << c.d << " cap " << c.cap << " window " << c.window;
}

const std::vector<Case> kCases = {
    {1, 4, 4, 32, 16, 0, {1}},               // a single key: the output is its value
    {2, 8, 4, 64, 300, 0, {300, 17}},        // full and short rows, grouped heads
    {3, 8, 2, 128, 700, 64, {700, 65, 3}},   // a window that binds, one that just binds, one that does not
    {2, 4, 1, 64, 4096, 512, {4096, 2049}},  // many key ranges, most outside the window
    {1, 16, 4, 256, 130, 0, {129}},          // the widest head
};

}  // namespace

TEST(DecodeAttention, CpuMatchesTheFloat64Loop) {
  for (const auto& c : kCases) check(c, torch::kCPU, torch::kFloat, 1e-5);
}

// With a keep mask (a DSA layer's selection): only the marked keys of each row's range take part. Each row keeps its
// last key and about a third of the others, so some key ranges of the CUDA kernel keep none.
void check_keep(const Case& c, const torch::Device& device, torch::ScalarType dtype, double tol) {
  torch::manual_seed(c.b * 17 + c.cap);
  auto o = torch::TensorOptions().dtype(dtype).device(device);
  auto q = torch::randn({c.b, c.h, c.d}, o), k = torch::randn({c.b, c.kv, c.cap, c.d}, o),
       v = torch::randn({c.b, c.kv, c.cap, c.d}, o);
  auto keep = torch::rand({c.b, c.cap}) < 0.3;
  for (int64_t r = 0; r < c.b; ++r) keep[r][c.lengths[static_cast<size_t>(r)] - 1] = true;
  auto out = ops::decode_attention(q, k, v, torch::tensor(c.lengths, torch::kLong).to(device), c.window, std::nullopt,
                                   keep.to(device));
  const auto ref = loop_reference(q, k, v, c.lengths, c.window, keep);
  EXPECT_LE(max_rel(out, ref), tol) << "b " << c.b << " cap " << c.cap << " window " << c.window;
  // The mask matters: without it the output differs.
  EXPECT_GT(max_rel(ops::decode_attention(q, k, v, torch::tensor(c.lengths, torch::kLong).to(device), c.window), ref),
            10 * tol);
}

TEST(DecodeAttention, CpuKeepMaskMatchesTheFloat64Loop) {
  for (const auto& c : kCases)
    if (c.cap > 16) check_keep(c, torch::kCPU, torch::kFloat, 1e-5);
}

TEST(DecodeAttention, RejectsLengthsOutsideTheCache) {
  auto q = torch::randn({1, 2, 32}), k = torch::randn({1, 2, 8, 32});
  EXPECT_THROW(ops::decode_attention(q, k, k, torch::tensor({9}, torch::kLong), 0), Error);
  EXPECT_THROW(ops::decode_attention(q, k, k, torch::tensor({0}, torch::kLong), 0), Error);
  EXPECT_THROW(ops::decode_attention(q, k, k, torch::tensor({1}, torch::kInt), 0), Error);
  EXPECT_THROW(ops::decode_attention(torch::randn({1, 3, 32}), k, k, torch::tensor({1}, torch::kLong), 0), Error);
}

TEST(DecodeAttentionCuda, KernelMatchesTheFloat64Loop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : kCases) {
    check(c, torch::kCUDA, torch::kFloat, 1e-5);
    check(c, torch::kCUDA, torch::kBFloat16, 1e-2);
  }
}

TEST(DecodeAttentionCuda, KernelKeepMaskMatchesTheFloat64Loop) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto& c : kCases)
    if (c.cap > 16) {
      check_keep(c, torch::kCUDA, torch::kFloat, 1e-5);
      check_keep(c, torch::kCUDA, torch::kBFloat16, 1e-2);
    }
}
