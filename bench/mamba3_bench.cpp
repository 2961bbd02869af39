// The Mamba-3 scan on CUDA, forward and forward + backward: the fused kernels (ops/cuda/mamba3_scan_kernels.cu,
// through ops::mamba3_scan_fused) against the libtorch path the layer took before them (mamba3_preprocess +
// mamba3_scan_chunked, chunks of 64 for SISO, 16 for MIMO as nam56r's recipe) in the same run, at hybrid-250m's
// Mamba-3 shapes (32 heads, P 64, N 128, one group, 32 rotary angles) with packed documents of ~512 tokens.
//   mamba3_bench [batch] [tokens] [reps] [heads] [d_state] [rank] [groups]   (defaults: 16 x 1024, 10, 32 heads,
//   N 128, SISO, one group; d_state / 4 rotary angles, as the recipes' rope_fraction 0.5 gives; specialist-small's
//   layer is 16 heads, N 64; nam56r's is `2 4096 10 64 128 4 8`: 64 heads, MIMO rank 4, 8 groups)
// Roofline: FLOPs per row (a token of SISO, a token and rank of MIMO) and head of the chunked form at the kernels'
// chunk of Q = 32 rows, causal halves counted once: forward QN + QP (scores, intra-chunk outputs) + 4PN (inter-chunk
// outputs, state update); backward 3Q(N + P) + 8PN. Against the FP32 CUDA-core peak and the bytes that must move: x, y,
// dy, dx, the B/C gradients per head, and the state saved per chunk (written forward, read backward).
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "median_timer.h"
#include "slm/ops/mamba3_scan.h"

namespace {

constexpr double kFp32PeakTflops = 67.0;  // H100/H200 SXM, CUDA cores, FMA counted as 2
constexpr double kHbmTbps = 4.2;          // copy bandwidth measured on an H200 (tool notes)

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("mamba3_bench: no CUDA device; the fused scan is for the GPU, nothing to time here\n");
    return 0;
  }
  const int64_t b = argc > 1 ? std::stoll(argv[1]) : 16, t = argc > 2 ? std::stoll(argv[2]) : 1024;
  const int reps = argc > 3 ? std::stoi(argv[3]) : 10;
  const int64_t h = argc > 4 ? std::stoll(argv[4]) : 32, p = 64, n = argc > 5 ? std::stoll(argv[5]) : 128,
                r = argc > 6 ? std::stoll(argv[6]) : 1, g = argc > 7 ? std::stoll(argv[7]) : 1, s = n / 4;
  torch::manual_seed(0);
  auto o = torch::TensorOptions().device(torch::kCUDA);
  auto leaf = [](torch::Tensor x) { return x.set_requires_grad(true); };
  slm::ops::Mamba3Projections proj{leaf(torch::randn({b, t, h, p}, o)),    leaf(torch::randn({b, t, r, g, n}, o)),
                                   leaf(torch::randn({b, t, r, g, n}, o)), leaf(torch::randn({b, t, h}, o)),
                                   leaf(torch::randn({b, t, h}, o)),       leaf(torch::randn({b, t, h}, o) * 2),
                                   leaf(torch::randn({b, t, s}, o))};
  slm::ops::Mamba3Weights w{leaf(torch::randn({h}, o) * 0.5 - 2),
                            leaf(torch::ones({h, r, n}, o)),
                            leaf(torch::ones({h, r, n}, o)),
                            leaf(torch::ones({n}, o)),
                            leaf(torch::ones({n}, o)),
                            r > 1 ? leaf(torch::rand({h, r, p}, o) + 0.5) : torch::Tensor(),
                            leaf(torch::ones({h}, o))};
  const auto state = slm::ops::mamba3_zero_state(b, h, p, n, r, s, o);
  const auto start = torch::rand({b, t}, o) < 1.0 / 512;
  if (!slm::ops::mamba3_fused(proj, w)) {
    std::printf("mamba3_bench: this build has no fused Mamba-3 kernels (configure with SLM_CUDA=ON)\n");
    return 1;
  }
  auto run = [&](bool fused, bool backward) {
    auto [y, next] = fused ? slm::ops::mamba3_scan_fused(proj, w, state, start)
                           : slm::ops::mamba3_scan_chunked(slm::ops::mamba3_preprocess(proj, w, state.angle, start),
                                                           state, r > 1 ? 16 : 64);
    if (backward) torch::autograd::backward({y.sum()});
  };
  const double per = static_cast<double>(b) * t * h * r, q = 32;
  const double fwd_flops = per * (q * n + q * p + 4.0 * p * n),
               all_flops = fwd_flops + per * (3 * q * (n + p) + 8.0 * p * n);
  const double state_bytes = per / q * p * n * 4;
  const double fwd_bytes = per * 4.0 * 2 * p + state_bytes,
               all_bytes = fwd_bytes + per * 4.0 * (2 * p + 2 * n) + state_bytes;
  std::printf(
      "Mamba-3 scan (rank %lld): batch %lld x %lld tokens, %lld heads, P %lld, N %lld, %lld groups, %lld angles, "
      "documents ~512 tokens, %d reps (median)\n",
      static_cast<long long>(r), static_cast<long long>(b), static_cast<long long>(t), static_cast<long long>(h),
      static_cast<long long>(p), static_cast<long long>(n), static_cast<long long>(g), static_cast<long long>(s), reps);
  std::printf("roofline: forward %.2f GFLOP, %.0f MB; forward+backward %.2f GFLOP, %.0f MB -> %.3f ms\n",
              fwd_flops / 1e9, fwd_bytes / 1e6, all_flops / 1e9, all_bytes / 1e6,
              std::max(all_flops / kFp32PeakTflops / 1e9, all_bytes / kHbmTbps / 1e9));
  const double fused_fwd = slm::bench::median_ms([&] { run(true, false); }, reps, true);
  const double fused_all = slm::bench::median_ms([&] { run(true, true); }, reps, true);
  const double ref_fwd = slm::bench::median_ms([&] { run(false, false); }, reps, true);
  const double ref_all = slm::bench::median_ms([&] { run(false, true); }, reps, true);
  auto roof = [&](double flops, double bytes, double ms) {
    return 100.0 * std::max(flops / kFp32PeakTflops / 1e9, bytes / kHbmTbps / 1e9) / ms;
  };
  std::printf("%-30s %10s %10s %10s\n", "path (incl. preprocessing)", "ms", "TFLOP/s", "roofline");
  auto row = [&](const char* name, double flops, double bytes, double ms) {
    std::printf("%-30s %10.3f %10.2f %9.1f%%\n", name, ms, flops / ms / 1e9, roof(flops, bytes, ms));
  };
  row("fused forward", fwd_flops, fwd_bytes, fused_fwd);
  row("fused fwd+bwd", all_flops, all_bytes, fused_all);
  row("libtorch chunked forward", fwd_flops, fwd_bytes, ref_fwd);
  row("libtorch chunked fwd+bwd", all_flops, all_bytes, ref_all);
  std::printf("libtorch / fused: forward %.1fx, fwd+bwd %.1fx\n", ref_fwd / fused_fwd, ref_all / fused_all);
  return 0;
}
