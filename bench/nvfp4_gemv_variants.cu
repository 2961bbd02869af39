// Configuration sweep of the NVFP4 GEMV kernel (not a test; see bench/RESULTS.md). It includes the kernel's
// translation unit to reach its template parameters (warps per CTA S, steps per batch U, staged activations XS,
// programmatic dependent launch PDL) and times each configuration like nvfp4_gemv_bench: 64 launches per CUDA graph,
// weight copies rotating through 256 MiB. It also times the streaming-read reference at several sizes, because a
// read of a few MiB cannot reach the bandwidth of a 1 GiB one.
//
//   nvcc -std=c++17 -arch=sm_90 -O3 -I src -I bench bench/nvfp4_gemv_variants.cu -o /tmp/nvfp4_gemv_variants
//   /tmp/nvfp4_gemv_variants            # on the GPU machine; about a minute
//
// Random codes and scales; for 4096x4096 and 1024x4096 every seventh (resp. every) row is checked against a float64
// CPU loop: "err" is max |y - ref| / sum |terms|.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../bench/gpu_read_bandwidth.cu"
#include "../src/slm/quant/cuda/nvfp4_gemv.cu"

namespace {

using slm::nvfp4::cuda::launch_kernel;

void ck(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::printf("CUDA error %s at line %d: %s\n", cudaGetErrorString(e), line, what);
    std::exit(1);
  }
}
#define CK(x) ck((x), #x, __LINE__)

// Seconds per launch: per_graph launches captured into a graph, replayed until min_time has passed.
template <class F>
double time_graph(cudaStream_t st, int per_graph, F&& enqueue, double min_time = 0.15) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) enqueue(i);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  int reps = 1;
  float ms = 0;
  for (;;) {
    CK(cudaEventRecord(a, st));
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms, a, b));
    if (ms * 1e-3 >= min_time || reps >= (1 << 16)) break;
    reps *= 2;
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms * 1e-3 / (static_cast<double>(reps) * per_graph);
}

double e2m1(int c) {
  static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -v[c & 7] : v[c & 7];
}
double e4m3(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
}

struct Problem {
  int64_t N, K, blocks;
  int copies;
  std::vector<uint8_t> codes_h, scales_h;
  std::vector<uint16_t> x_h;  // 16 rows of BF16 bits
  std::vector<uint8_t*> codes, scales;
  float* ts;
  __nv_bfloat16* x;
  float* y;
  double bytes() const { return static_cast<double>(N) * blocks * 9; }  // 8 code bytes + 1 scale byte per block
};

constexpr float kTensorScale = 0.75f;

Problem make_problem(int64_t N, int64_t K, std::mt19937& rng) {
  Problem p;
  p.N = N;
  p.K = K;
  p.blocks = (K + 15) / 16;
  p.copies = std::max(2, static_cast<int>(std::ceil(256.0 * 1048576 / p.bytes())));
  p.codes_h.resize(N * p.blocks * 8);
  p.scales_h.resize(N * p.blocks);
  for (auto& c : p.codes_h) c = rng() & 0xFF;
  for (auto& s : p.scales_h) s = 0x30 + rng() % 0x20;  // E4M3 0.5 .. 3.75
  for (int i = 0; i < p.copies; ++i) {
    uint8_t *c, *s;
    CK(cudaMalloc(&c, p.codes_h.size()));
    CK(cudaMalloc(&s, p.scales_h.size()));
    CK(cudaMemcpy(c, p.codes_h.data(), p.codes_h.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s, p.scales_h.data(), p.scales_h.size(), cudaMemcpyHostToDevice));
    p.codes.push_back(c);
    p.scales.push_back(s);
  }
  CK(cudaMalloc(&p.ts, 4));
  CK(cudaMemcpy(p.ts, &kTensorScale, 4, cudaMemcpyHostToDevice));
  p.x_h.resize(16 * p.blocks * 16);
  std::normal_distribution<float> normal;
  for (auto& v : p.x_h) {
    const float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  CK(cudaMalloc(&p.x, p.x_h.size() * 2));
  CK(cudaMemcpy(p.x, p.x_h.data(), p.x_h.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&p.y, 16 * N * 4));
  return p;
}

void free_problem(Problem& p) {
  for (auto c : p.codes) CK(cudaFree(c));
  for (auto s : p.scales) CK(cudaFree(s));
  CK(cudaFree(p.ts));
  CK(cudaFree(p.x));
  CK(cudaFree(p.y));
}

double max_error(const Problem& p, int M, int64_t row_step) {
  std::vector<float> y(M * p.N);
  CK(cudaMemcpy(y.data(), p.y, y.size() * 4, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int64_t n = 0; n < p.N; n += row_step) {
    for (int m = 0; m < M; ++m) {
      double sum = 0, mag = 0;
      for (int64_t b = 0; b < p.blocks; ++b) {
        const double sc = e4m3(p.scales_h[n * p.blocks + b]);
        for (int i = 0; i < 16; ++i) {
          const uint8_t byte = p.codes_h[(n * p.blocks + b) * 8 + i / 2];
          const uint32_t bits = static_cast<uint32_t>(p.x_h[m * p.blocks * 16 + b * 16 + i]) << 16;
          float xv;
          std::memcpy(&xv, &bits, 4);
          const double term = e2m1((i & 1) ? byte >> 4 : byte & 15) * sc * xv;
          sum += term;
          mag += std::fabs(term);
        }
      }
      const double e = std::fabs(y[m * p.N + n] - sum * kTensorScale) / (mag * kTensorScale + 1e-30);
      worst = std::isnan(e) ? 1e9 : std::max(worst, e);
    }
  }
  return worst;
}

template <int MT, int S, bool XS, int U, bool PDL>
void variant(const char* name, Problem& p, int M, cudaStream_t st, double bw, int64_t check_step) {
  const size_t static_bytes = 256 * 4 + S * 16 * 8 * MT * 4;
  const size_t staged = XS ? static_cast<size_t>(M) * (p.blocks * 2 + 1) * 16 : 0;
  if (staged + static_bytes > 48 * 1024) return;
  auto enqueue = [&](int i) {
    CK((launch_kernel<2, MT, S, XS, U, PDL>(M, p.codes[i % p.copies], p.scales[i % p.copies], p.ts, p.x, p.y, p.N,
                                            p.blocks, staged, st)));
  };
  double err = -1;
  if (check_step > 0) {
    CK(cudaMemset(p.y, 0xFF, 16 * p.N * 4));  // NaN: unwritten outputs fail the check
    enqueue(0);
    CK(cudaStreamSynchronize(st));
    err = max_error(p, M, check_step);
  }
  const double t1 = time_graph(st, 64, enqueue), t2 = time_graph(st, 64, enqueue);
  const double t = std::min(t1, t2);
  std::printf("%-18s %6lld x %6lld M %2d | %7.2f us (%7.2f) %6.0f GB/s %5.1f%% |", name, static_cast<long long>(p.N),
              static_cast<long long>(p.K), M, t * 1e6, std::max(t1, t2) * 1e6, p.bytes() / t / 1e9,
              100 * p.bytes() / t / bw);
  if (err >= 0)
    std::printf(" err %.1e\n", err);
  else
    std::printf(" -\n");
  std::fflush(stdout);
}

__global__ void empty_kernel(float* y) {
  if (threadIdx.x == 1000) y[0] = 1;
}

}  // namespace

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  double bw = 0;
  for (size_t mib : {1024, 64, 24, 16, 9}) {
    const size_t bytes = mib << 20;
    const int n = std::max<int>(2, static_cast<int>(512 / mib));
    std::vector<void*> bufs(n);
    for (auto& b : bufs) {
      CK(cudaMalloc(&b, bytes));
      CK(cudaMemset(b, 1, bytes));
    }
    unsigned* sink;
    CK(cudaMalloc(&sink, 4));
    const double t = time_graph(
        st, 16, [&](int i) { slm::bench::enqueue_read(bufs[i % n], bytes, sink, st); }, 0.3);
    std::printf("streaming read %5zu MiB: %7.2f us  %6.0f GB/s\n", mib, t * 1e6, bytes / t / 1e9);
    if (mib == 1024) bw = bytes / t;
    for (auto& b : bufs) CK(cudaFree(b));
    CK(cudaFree(sink));
  }
  {
    float* y;
    CK(cudaMalloc(&y, 4));
    const double t = time_graph(st, 64, [&](int) { empty_kernel<<<264, 256, 0, st>>>(y); });
    std::printf("empty kernel in a graph: %.2f us per launch\n\n", t * 1e6);
    CK(cudaFree(y));
  }
  // "shipped" marks the launcher's choice for the shape (nvfp4_gemv.cu, launch()).
  std::mt19937 rng(1);
  struct Shape {
    int64_t n, k;
  };
  for (Shape s : {Shape{4096, 4096}, Shape{11008, 4096}, Shape{4096, 11008}, Shape{1024, 4096}}) {
    Problem p = make_problem(s.n, s.k, rng);
    const bool few_tiles = (s.n + 15) / 16 <= 264;
    const int64_t step = s.k == 4096 && s.n <= 4096 ? (s.n > 1024 ? 7 : 1) : 0;
    for (int M : {1, 4, 8, 16}) {
      if (M == 1) {
        variant<1, 16, true, 2, true>(few_tiles ? "S16 XS U2 (shipped)" : "S16 XS U2", p, M, st, bw, step);
        variant<1, 8, true, 4, true>(few_tiles ? "S8 XS U4" : "S8 XS U4 (shipped)", p, M, st, bw, step);
        variant<1, 16, true, 1, true>("S16 XS U1", p, M, st, bw, step);
        variant<1, 16, true, 2, false>("S16 XS U2 no-PDL", p, M, st, bw, step);
        variant<1, 8, true, 4, false>("S8 XS U4 no-PDL", p, M, st, bw, step);
      } else if (M <= 8) {
        variant<1, 16, false, 2, true>(few_tiles ? "S16 U2 (shipped)" : "S16 U2", p, M, st, bw, step);
        variant<1, 8, false, 2, true>(few_tiles ? "S8 U2" : "S8 U2 (shipped)", p, M, st, bw, step);
        variant<1, 16, true, 2, true>("S16 XS U2", p, M, st, bw, step);
      } else {
        variant<2, 16, false, 2, true>(few_tiles ? "MT2 S16 U2 (shipped)" : "MT2 S16 U2", p, M, st, bw, step);
        variant<2, 8, false, 2, true>(few_tiles ? "MT2 S8 U2" : "MT2 S8 U2 (shipped)", p, M, st, bw, step);
        variant<2, 8, false, 1, true>("MT2 S8 U1", p, M, st, bw, step);
      }
    }
    free_problem(p);
  }
  std::printf(
      "\n(bytes: 0.5 B of codes + 1/16 B of scale per weight; %% of the 1 GiB streaming read; PDL unless "
      "marked; XS: activations staged in shared memory)\n");
  return 0;
}
