// NVFP4 GEMV vs BF16/FP32 matmul at decode shapes (not a test; see bench/RESULTS.md).
//
//   nvfp4_gemv_bench [--device cpu|cuda|all] [--batch 1,4,16] [--quick] [--rotate-mb 256]
//
// For each weight shape [N, K] and batch M it times y = x W^T with
//   CPU:  slm::nvfp4::linear (NVFP4, on-the-fly dequant, FP32 accumulation; each CPU kernel this machine runs) vs
//         torch::matmul with FP32 and BF16 weights (libtorch's own kernels);
//   CUDA: the NVFP4 GEMV kernel (BF16 activations; with programmatic dependent launch, as nvfp4::linear runs it, and
//         with plain launches) vs cuBLAS cublasGemmEx with BF16 weights; launches are recorded into a CUDA graph so
//         launch overhead does not hide the kernels, and timed with CUDA events.
// Every variant rotates among enough copies of its weights (--rotate-mb in total, at least 2 copies) that caches
// (CPU L3, GPU 50 MB L2) cannot serve them. It prints the time per product, the achieved weight bytes/s, the ratio to
// a bandwidth measured in the same run (CPU: a multi-threaded sum over 1 GiB; GPU: a streaming read kernel) and the
// speed-up of NVFP4 over each reference.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "slm/quant/nvfp4.h"
#include "slm/quant/nvfp4_linear.h"

#ifdef SLM_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu_graph_timer.h"
#include "gpu_read_bandwidth.h"
#include "slm/quant/cuda/nvfp4_gemv.h"
#endif

namespace fp4 = slm::nvfp4;

namespace {

struct Shape {
  int64_t n, k;
  const char* what;
};

const std::vector<Shape> kShapes = {
    {4096, 4096, "attn proj 4096x4096"},
    {11008, 4096, "MLP up 11008x4096"},
    {4096, 11008, "MLP down 4096x11008"},
    {1024, 4096, "expert-like 1024x4096"},
};

struct Options {
  std::string device = "all";
  std::vector<int64_t> batches = {1};
  bool quick = false;
  double rotate_mb = 256;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int copies_for(double bytes_per_copy, const Options& o) {
  return std::max(2, static_cast<int>(std::ceil(o.rotate_mb * 1048576.0 / bytes_per_copy)));
}

// Times fn(i) (i = call index) and returns seconds per call: warm-up, then repeat until min_time has passed.
template <class F>
double time_calls(F&& fn, double min_time, int min_calls) {
  for (int i = 0; i < 3; ++i) fn(i);
  int calls = 0;
  double t0 = now_s(), t = t0;
  while (calls < min_calls || t - t0 < min_time) {
    fn(calls);
    ++calls;
    if (calls % 4 == 0) t = now_s();
  }
  t = now_s();
  return (t - t0) / calls;
}

double cpu_bandwidth(const Options& o) {
  torch::Tensor big = torch::ones({(o.quick ? 256 : 1024) * 1048576 / 4}, torch::kFloat);
  double bytes = static_cast<double>(big.numel()) * 4;
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    double t0 = now_s();
    volatile float s = big.sum().item<float>();
    (void)s;
    best = std::max(best, bytes / (now_s() - t0));
  }
  return best;
}

void run_cpu(const Options& o) {
  std::printf("== CPU: %d threads ==\n", torch::get_num_threads());
  double bw = cpu_bandwidth(o);
  std::printf("measured read bandwidth (torch sum over %d MiB, best of 5): %.2f GB/s\n\n", o.quick ? 256 : 1024,
              bw / 1e9);
  // Every CPU kernel this machine runs, the one nvfp4::linear picks first.
  std::vector<fp4::CpuKernel> kernels;
  for (auto k : {fp4::CpuKernel::Avx512Bf16, fp4::CpuKernel::Avx2, fp4::CpuKernel::Portable})
    if (fp4::cpu_kernel_available(k)) kernels.push_back(k);
  std::printf("NVFP4 kernel (what nvfp4::linear picks): %s; also timed:", fp4::cpu_kernel_name(fp4::CpuKernel::Auto));
  for (size_t i = 1; i < kernels.size(); ++i) std::printf(" %s", fp4::cpu_kernel_name(kernels[i]));
  std::printf("\n\n%-24s %3s | %10s %8s %5s | %10s %8s %7s | %10s %8s %7s", "shape", "M", "NVFP4 us", "GB/s", "%bw",
              "FP32 us", "GB/s", "speedup", "BF16 us", "GB/s", "speedup");
  for (size_t i = 1; i < kernels.size(); ++i) std::printf(" | %11s us", fp4::cpu_kernel_name(kernels[i]));
  std::printf("\n");
  const double min_time = o.quick ? 0.2 : 1.0;
  for (const auto& s : kShapes) {
    torch::manual_seed(1);
    torch::Tensor w = torch::randn({s.n, s.k}).to(torch::kBFloat16);
    fp4::QTensor q = fp4::quantize(w);
    const double qbytes = static_cast<double>(q.storage_bytes());
    const double f32bytes = static_cast<double>(s.n * s.k * 4), bf16bytes = static_cast<double>(s.n * s.k * 2);
    std::vector<fp4::QTensor> qs;
    for (int i = 0, c = copies_for(qbytes, o); i < c; ++i) {
      fp4::QTensor qc = q;
      qc.codes = q.codes.clone();
      qc.scales = q.scales.clone();
      qc.tensor_scale = q.tensor_scale.clone();
      qs.push_back(qc);
    }
    std::vector<torch::Tensor> f32s, bf16s;
    for (int i = 0, c = copies_for(f32bytes, o); i < c; ++i) f32s.push_back(w.to(torch::kFloat).contiguous());
    for (int i = 0, c = copies_for(bf16bytes, o); i < c; ++i) bf16s.push_back(w.clone());
    for (int64_t M : o.batches) {
      torch::Tensor x = torch::randn({M, s.k});
      torch::Tensor xb = x.to(torch::kBFloat16);
      std::vector<double> tk;
      for (auto k : kernels) {
        fp4::set_cpu_kernel(k);
        tk.push_back(time_calls([&](int i) { fp4::linear(x, qs[i % qs.size()]); }, min_time, 8));
      }
      fp4::set_cpu_kernel(fp4::CpuKernel::Auto);
      const double tq = tk[0];
      double tf = time_calls([&](int i) { torch::matmul(x, f32s[i % f32s.size()].t()); }, min_time, 4);
      double tb = time_calls([&](int i) { torch::matmul(xb, bf16s[i % bf16s.size()].t()); }, min_time, 4);
      std::printf("%-24s %3lld | %10.1f %8.2f %4.0f%% | %10.1f %8.2f %6.2fx | %10.1f %8.2f %6.2fx", s.what,
                  static_cast<long long>(M), tq * 1e6, qbytes / tq / 1e9, 100 * qbytes / tq / bw, tf * 1e6,
                  f32bytes / tf / 1e9, tf / tq, tb * 1e6, bf16bytes / tb / 1e9, tb / tq);
      for (size_t i = 1; i < tk.size(); ++i) std::printf(" | %14.1f", tk[i] * 1e6);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  std::printf(
      "\n(GB/s = weight bytes streamed per second; %%bw = NVFP4 GB/s / measured bandwidth; speedup = reference "
      "time / NVFP4 time; NVFP4 storage 0.5625 B/param, BF16 2, FP32 4)\n");
}

#ifdef SLM_WITH_CUDA

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void ck(cublasStatus_t e, const char* what) {
  if (e != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS error %d in %s\n", static_cast<int>(e), what);
    std::exit(1);
  }
}
#define CK(x) ck((x), #x)

template <class T>
T* device_copy(const void* host, size_t bytes) {
  void* d = nullptr;
  CK(cudaMalloc(&d, bytes));
  CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return static_cast<T*>(d);
}

using slm::bench::time_graph;

// Read bandwidth (what the GEMV needs): a streaming 16-byte-load kernel over two 1 GiB buffers in turn.
double gpu_bandwidth(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMalloc(reinterpret_cast<void**>(&sink), sizeof(unsigned)));
  CK(cudaMemsetAsync(a, 1, bytes, stream));
  CK(cudaMemsetAsync(b, 2, bytes, stream));
  double t = time_graph(
      stream, 4, [&](int i) { slm::bench::enqueue_read(i % 2 ? a : b, bytes, sink, stream); }, 0.5);
  CK(cudaGetLastError());
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(sink));
  return static_cast<double>(bytes) / t;
}

void run_cuda(const Options& o) {
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("== CUDA: no device, skipped ==\n");
    return;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  CK(cublasCreate(&handle));
  CK(cublasSetStream(handle, stream));
  void* workspace = nullptr;
  const size_t ws_bytes = size_t{32} << 20;
  CK(cudaMalloc(&workspace, ws_bytes));
  CK(cublasSetWorkspace(handle, workspace, ws_bytes));
  std::printf("== CUDA: %s, %d SMs, L2 %d MiB ==\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const double bw = gpu_bandwidth(stream);
  std::printf("measured read bandwidth (streaming 16-byte loads over 1 GiB): %.0f GB/s\n\n", bw / 1e9);
  std::printf("%-24s %3s | %9s %8s %5s | %9s %5s | %9s %8s %5s | %7s %7s | %s\n", "shape", "M", "NVFP4 us", "GB/s",
              "%bw", "no-PDL us", "%bw", "cuBLAS us", "GB/s", "%bw", "speedup", "no-PDL", "check");
  const double min_time = o.quick ? 0.1 : 0.5;
  for (const auto& s : kShapes) {
    torch::manual_seed(1);
    torch::Tensor w = torch::randn({s.n, s.k}).to(torch::kBFloat16);
    fp4::QTensor q = fp4::quantize(w);
    const int64_t blocks = q.blocks_per_row(), kp = q.k_padded();
    const double qbytes = static_cast<double>(q.storage_bytes()), bbytes = static_cast<double>(s.n * s.k * 2);
    struct QDev {
      uint8_t* codes;
      uint8_t* scales;
      float* ts;
    };
    std::vector<QDev> qd;
    for (int i = 0, c = copies_for(qbytes, o); i < c; ++i)
      qd.push_back({device_copy<uint8_t>(q.codes.data_ptr(), q.codes.numel()),
                    device_copy<uint8_t>(q.scales.data_ptr(), q.scales.numel()),
                    device_copy<float>(q.tensor_scale.data_ptr(), 4)});
    std::vector<void*> wd;
    torch::Tensor wc = w.contiguous();
    for (int i = 0, c = copies_for(bbytes, o); i < c; ++i) wd.push_back(device_copy<void>(wc.data_ptr(), bbytes));
    for (int64_t M : o.batches) {
      torch::Tensor x = torch::randn({M, s.k}).to(torch::kBFloat16);
      torch::Tensor xp = torch::constant_pad_nd(x, {0, kp - s.k}, 0.0).contiguous();
      auto* xd = device_copy<void>(xp.data_ptr(), xp.numel() * 2);
      float* yq = nullptr;
      void* yb = nullptr;
      CK(cudaMalloc(reinterpret_cast<void**>(&yq), M * s.n * 4));
      CK(cudaMalloc(&yb, M * s.n * 2));
      bool pdl = true;
      auto enqueue_q = [&](int i) {
        const QDev& d = qd[i % qd.size()];
        std::string err = fp4::cuda::gemv(d.codes, d.scales, d.ts, xd, yq, M, s.n, blocks, stream, pdl);
        if (!err.empty()) {
          std::fprintf(stderr, "nvfp4 gemv: %s\n", err.c_str());
          std::exit(1);
        }
      };
      const float alpha = 1.0f, beta = 0.0f;
      auto enqueue_b = [&](int i) {
        CK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), static_cast<int>(M),
                        static_cast<int>(s.k), &alpha, wd[i % wd.size()], CUDA_R_16BF, static_cast<int>(s.k), xd,
                        CUDA_R_16BF, static_cast<int>(kp), &beta, yb, CUDA_R_16BF, static_cast<int>(s.n),
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      const int per_graph = 64;
      double tq = time_graph(stream, per_graph, enqueue_q, min_time);
      pdl = false;
      double tq_plain = time_graph(stream, per_graph, enqueue_q, min_time);
      double tb = time_graph(stream, per_graph, enqueue_b, min_time);
      // Check the kernel against the CPU kernel on the same inputs.
      enqueue_q(0);
      CK(cudaStreamSynchronize(stream));
      torch::Tensor yg = torch::empty({M, s.n}, torch::kFloat);
      CK(cudaMemcpy(yg.data_ptr(), yq, M * s.n * 4, cudaMemcpyDeviceToHost));
      torch::Tensor yc = fp4::linear(x.to(torch::kFloat), q);
      double rel = ((yg - yc).abs().max() / yc.abs().max()).item<double>();
      std::printf(
          "%-24s %3lld | %9.2f %8.0f %4.0f%% | %9.2f %4.0f%% | %9.2f %8.0f %4.0f%% | %6.2fx %6.2fx | rel err %.1e\n",
          s.what, static_cast<long long>(M), tq * 1e6, qbytes / tq / 1e9, 100 * qbytes / tq / bw, tq_plain * 1e6,
          100 * qbytes / tq_plain / bw, tb * 1e6, bbytes / tb / 1e9, 100 * bbytes / tb / bw, tb / tq, tb / tq_plain,
          rel);
      std::fflush(stdout);
      CK(cudaFree(xd));
      CK(cudaFree(yq));
      CK(cudaFree(yb));
    }
    for (auto& d : qd) {
      CK(cudaFree(d.codes));
      CK(cudaFree(d.scales));
      CK(cudaFree(d.ts));
    }
    for (void* p : wd) CK(cudaFree(p));
  }
  std::printf(
      "\n(GB/s = weight bytes per second; %%bw = of the measured read bandwidth; speedup = cuBLAS BF16 time / "
      "NVFP4 time; NVFP4 launched with programmatic dependent launch (consecutive GEMVs overlap), no-PDL: "
      "plain launches; %d launches per CUDA graph, rotating weight copies)\n",
      64);
  CK(cudaFree(workspace));
  CK(cublasDestroy(handle));
  CK(cudaStreamDestroy(stream));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") {
      o.device = next();
    } else if (a == "--batch") {
      o.batches.clear();
      std::stringstream ss(next());
      std::string t;
      while (std::getline(ss, t, ',')) o.batches.push_back(std::stoll(t));
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--rotate-mb") {
      o.rotate_mb = std::stod(next());
    } else {
      std::fprintf(stderr, "usage: %s [--device cpu|cuda|all] [--batch 1,4,16] [--quick] [--rotate-mb 256]\n", argv[0]);
      return 2;
    }
  }
  std::time_t t = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&t));
  std::printf("nvfp4_gemv_bench  %s  libtorch %s  rotation %.0f MiB per variant\n\n", date, TORCH_VERSION, o.rotate_mb);
  if (o.device == "cpu" || o.device == "all") run_cpu(o);
  if (o.device == "cuda" || o.device == "all") {
#ifdef SLM_WITH_CUDA
    run_cuda(o);
#else
    std::printf("== CUDA: this build has no CUDA kernels (SLM_CUDA=OFF) ==\n");
#endif
  }
  return 0;
}
