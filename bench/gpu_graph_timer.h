#pragma once
// The GPU benchmarks' timer (nvfp4_gemv_bench, nvfp4_gemv_variants): launches captured into a CUDA graph, so that
// host launch overhead does not hide kernels of a few microseconds, replayed and timed with CUDA events.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace slm::bench {

// Benchmarks stop at the first CUDA error.
inline void cuda_or_exit(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Seconds per launch: `per_graph` launches (enqueue(i) for i < per_graph, e.g. rotating weight copies) are captured
// into a graph, which is replayed, doubling the replays, until one timing lasts min_time seconds.
template <class F>
double time_graph(cudaStream_t stream, int per_graph, F&& enqueue, double min_time) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_or_exit(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture");
  for (int i = 0; i < per_graph; ++i) enqueue(i);
  cuda_or_exit(cudaStreamEndCapture(stream, &graph), "graph capture end");
  cuda_or_exit(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
  cuda_or_exit(cudaGraphLaunch(exec, stream), "graph warm-up");
  cuda_or_exit(cudaStreamSynchronize(stream), "graph warm-up");
  cudaEvent_t a, b;
  cuda_or_exit(cudaEventCreate(&a), "event");
  cuda_or_exit(cudaEventCreate(&b), "event");
  int reps = 1;
  float ms = 0;
  for (;;) {
    cuda_or_exit(cudaEventRecord(a, stream), "event record");
    for (int r = 0; r < reps; ++r) cuda_or_exit(cudaGraphLaunch(exec, stream), "graph launch");
    cuda_or_exit(cudaEventRecord(b, stream), "event record");
    cuda_or_exit(cudaEventSynchronize(b), "graph replay");
    cuda_or_exit(cudaEventElapsedTime(&ms, a, b), "event time");
    if (ms * 1e-3 >= min_time || reps >= (1 << 16)) break;
    reps *= 2;
  }
  cuda_or_exit(cudaEventDestroy(a), "event");
  cuda_or_exit(cudaEventDestroy(b), "event");
  cuda_or_exit(cudaGraphExecDestroy(exec), "graph");
  cuda_or_exit(cudaGraphDestroy(graph), "graph");
  return ms * 1e-3 / (static_cast<double>(reps) * per_graph);
}

}  // namespace slm::bench
