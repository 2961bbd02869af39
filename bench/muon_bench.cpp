// CPU time of Muon's Newton-Schulz orthogonalisation (5 Polar Express steps, as the optimizer runs it) against
// one matmul of the same operand shape.
//   muon_bench [reps] [cpu|cuda]   (defaults 5, cpu; median reported)
// Per shape [batch x] m x n (m <= n after orienting): NS in bfloat16 and in float32 compute; the reference is
// one [m, n] x [n, m] matmul (the Gram product NS starts each step with) in the same dtype. flops-ratio is
// NS FLOPs / reference FLOPs (5 steps x (2 m^2 n + 2 m^3 + 2 m^2 n) over 2 m^2 n): what the ratio would be if
// every product ran at the same speed.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "median_timer.h"
#include "slm/train/muon.h"

namespace {

using slm::bench::median_ms;

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::stoi(argv[1]) : 5;
  const torch::Device device(argc > 2 ? argv[2] : "cpu");
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> shapes = {{256, 256},  {512, 512},  {1024, 1024},
                                              {512, 2048}, {2048, 512}, {16, 128, 512}};
  if (device.is_cuda()) shapes.insert(shapes.end(), {{4096, 4096}, {4096, 16384}, {64, 512, 2048}});  // full-size;
  std::printf("%s, threads %d, %d reps (median)\n", device.str().c_str(), torch::get_num_threads(), reps);
  std::printf("%-16s %10s %10s %10s %10s %9s %9s %10s\n", "shape", "NS bf16", "mm bf16", "NS fp32", "mm fp32",
              "ratio16", "ratio32", "flops-ratio");
  for (const auto& shape : shapes) {
    auto g = torch::randn(shape, device);
    const int64_t m = std::min(shape[shape.size() - 2], shape.back()),
                  n = std::max(shape[shape.size() - 2], shape.back());
    const int64_t batch = shape.size() == 3 ? shape[0] : 1;
    auto a32 = torch::randn({batch, m, n}, device), b32 = torch::randn({batch, n, m}, device);
    auto a16 = a32.to(torch::kBFloat16), b16 = b32.to(torch::kBFloat16);
    torch::Tensor sink;
    const double ns16 =
        median_ms([&] { sink = slm::train::newton_schulz(g, 5, slm::train::NsCoefficients::PolarExpress); }, reps,
                  device.is_cuda());
    const double ns32 = median_ms(
        [&] { sink = slm::train::newton_schulz(g, 5, slm::train::NsCoefficients::PolarExpress, torch::kFloat); }, reps,
        device.is_cuda());
    const double mm16 = median_ms([&] { sink = torch::bmm(a16, b16); }, reps, device.is_cuda());
    const double mm32 = median_ms([&] { sink = torch::bmm(a32, b32); }, reps, device.is_cuda());
    const double flops_ratio = 5.0 * (4.0 * m * m * n + 2.0 * m * m * m) / (2.0 * m * m * n);
    std::string name;
    for (size_t i = 0; i < shape.size(); ++i) name += (i ? "x" : "") + std::to_string(shape[i]);
    std::printf("%-16s %8.2fms %8.2fms %8.2fms %8.2fms %9.1f %9.1f %10.1f\n", name.c_str(), ns16, mm16, ns32, mm32,
                ns16 / mm16, ns32 / mm32, flops_ratio);
  }
  return 0;
}
