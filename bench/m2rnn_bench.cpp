// The M2RNN scan on CUDA, forward and forward + backward: the fused kernels (ops/cuda/m2rnn_scan_kernels.cu)
// against the libtorch reference loop in the same run, at hybrid-250m's M2RNN shapes (32 heads, K 64, V 16,
// checkpoints every 64 tokens, clip 1) with packed-document resets.
//   m2rnn_bench [batch] [tokens] [reps]   (defaults: 16 x 1024, 10)
// The reference runs in float64 (the dispatch sends FP32/BF16 CUDA inputs to the kernels): it is a loop of a dozen
// small launches per token, bound by launch latency, so its dtype barely changes its time.
// Roofline: FLOPs per token and head, forward 2KV² (H W) + 8KV (k vᵀ, the convex mix, Hᵀq); the backward
// recomputes the forward and adds 2KV² (du Wᵀ) + 2KV² (dW) + 10KV; against the FP32 CUDA-core peak and the bytes
// of q, k, v, f, y and their gradients. At V 8 and 16 the V×V products run on the tensor cores as split TF32
// (three products each), which this roofline still counts as FP32 FLOPs. SLM_M2RNN_KERNEL=rows times the
// row-per-thread CUDA-core kernels instead.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "median_timer.h"
#include "slm/ops/m2rnn_scan.h"

namespace {

constexpr double kFp32PeakTflops = 67.0;  // H100/H200 SXM, CUDA cores, FMA counted as 2
constexpr double kHbmTbps = 4.2;          // copy bandwidth measured on an H200 (tool notes)

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("m2rnn_bench: no CUDA device; the fused scan is for the GPU, nothing to time here\n");
    return 0;
  }
  const int64_t b = argc > 1 ? std::stoll(argv[1]) : 16, t = argc > 2 ? std::stoll(argv[2]) : 1024;
  const int reps = argc > 3 ? std::stoi(argv[3]) : 10;
  const int64_t nh = 32, kd = 64, vd = 16, every = 64;
  const double clip = 1.0;
  torch::manual_seed(0);
  auto o = torch::TensorOptions().device(torch::kCUDA);
  auto make = [&](torch::Dtype dt) {
    auto leaf = [&](torch::Tensor x) { return x.to(dt).set_requires_grad(true); };
    return std::vector<torch::Tensor>{
        leaf(torch::randn({b, t, nh, kd}, o)),
        leaf(torch::randn({b, t, nh, kd}, o) * 0.5),
        leaf(torch::randn({b, t, nh, vd}, o)),
        leaf(torch::rand({b, t, nh}, o) * 0.8 + 0.1),
        leaf(torch::eye(vd, o).expand({nh, vd, vd}) + 0.3 * torch::randn({nh, vd, vd}, o)),
        leaf(torch::randn({nh, vd}, o)),
        leaf(torch::zeros({b, nh, kd, vd}, o))};
  };
  auto reset = torch::rand({b, t}, o) < 1.0 / 512;  // documents of ~512 tokens
  auto run = [&](const std::vector<torch::Tensor>& in, bool backward) {
    auto [y, h] = slm::ops::m2rnn_scan(in[0], in[1], in[2], in[3], in[4], in[5], in[6], clip, every, reset);
    if (backward) torch::autograd::backward({y.sum() + h.sum()});
  };
  auto fp32 = make(torch::kFloat), fp64 = make(torch::kDouble);
  if (!slm::ops::m2rnn_fused(fp32[0], fp32[2], fp32[4], every)) {
    std::printf("m2rnn_bench: this build has no fused M2RNN kernels (configure with SLM_CUDA=ON)\n");
    return 1;
  }
  const double per = static_cast<double>(b) * t * nh;
  const double kv = static_cast<double>(kd) * vd, kvv = kv * vd;
  const double fwd_flops = per * (2 * kvv + 8 * kv),
               all_flops = fwd_flops + per * (2 * kvv + 8 * kv + 4 * kvv + 10 * kv);
  const double fwd_bytes = 4.0 * per * (2 * kd + 2 * vd + 1), all_bytes = 2 * fwd_bytes + fwd_bytes;

  std::printf(
      "M2RNN scan: batch %lld x %lld tokens, %lld heads, K %lld, V %lld, checkpoints every %lld, clip %.0f, "
      "%d reps (median)\n",
      static_cast<long long>(b), static_cast<long long>(t), static_cast<long long>(nh), static_cast<long long>(kd),
      static_cast<long long>(vd), static_cast<long long>(every), clip, reps);
  const char* kernels = std::getenv("SLM_M2RNN_KERNEL");
  std::printf("kernels: %s\n", kernels && std::string(kernels) == "rows" ? "row per thread (SLM_M2RNN_KERNEL=rows)"
                                                                         : "tensor-core (split TF32)");
  std::printf(
      "roofline: forward %.2f GFLOP, %.0f MB; forward+backward %.2f GFLOP, %.0f MB -> %.3f ms at %.0f "
      "TFLOP/s FP32\n",
      fwd_flops / 1e9, fwd_bytes / 1e6, all_flops / 1e9, all_bytes / 1e6, all_flops / kFp32PeakTflops / 1e9,
      kFp32PeakTflops);
  const double fused_fwd = slm::bench::median_ms([&] { run(fp32, false); }, reps, true);
  const double fused_all = slm::bench::median_ms([&] { run(fp32, true); }, reps, true);
  const double ref_all = slm::bench::median_ms([&] { run(fp64, true); }, 1, true);
  auto roof = [&](double flops, double bytes, double ms) {
    return 100.0 * std::max(flops / kFp32PeakTflops / 1e9, bytes / kHbmTbps / 1e9) / ms;
  };
  std::printf("%-22s %10s %10s %10s\n", "path", "ms", "TFLOP/s", "roofline");
  std::printf("%-22s %10.3f %10.2f %9.1f%%\n", "fused forward", fused_fwd, fwd_flops / fused_fwd / 1e9,
              roof(fwd_flops, fwd_bytes, fused_fwd));
  std::printf("%-22s %10.3f %10.2f %9.1f%%\n", "fused fwd+bwd", fused_all, all_flops / fused_all / 1e9,
              roof(all_flops, all_bytes, fused_all));
  std::printf("%-22s %10.3f %10.2f %9.1f%%\n", "reference fwd+bwd", ref_all, all_flops / ref_all / 1e9,
              roof(all_flops, all_bytes, ref_all));
  std::printf("reference / fused (fwd+bwd): %.1fx\n", ref_all / fused_all);
  return 0;
}
