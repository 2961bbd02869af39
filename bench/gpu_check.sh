#!/usr/bin/env bash
# On the GPU machine: build with SLM_CUDA=ON, run the NVFP4 tests (the CUDA one included), the GEMV benchmark and
# the kernel's configuration sweep.
#   bash bench/gpu_check.sh                 # BUILD_DIR=build-cuda; set SLM_DEPS_PREFIX as for scripts/setup.sh
# Output: the test summary and the benchmark table, also saved to $BUILD_DIR/nvfp4_gpu_check.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
out="$BUILD_DIR/nvfp4_gpu_check.txt"

SLM_CUDA=ON BUILD_DIR="$BUILD_DIR" bash scripts/setup.sh
cmake --build "$BUILD_DIR" --target nvfp4_gemv_bench
mkdir -p "$BUILD_DIR"
{
  echo "# nvfp4 gpu check $(date -u '+%Y-%m-%d %H:%M UTC') commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv || true
  "$BUILD_DIR/slm" info || true
} 2>&1 | tee "$out"

status=0
# The CUDA test must run, not skip: fail if gtest reports it skipped.
"$BUILD_DIR/tests/slm_tests" --gtest_filter='Nvfp4*:Safetensors*' 2>&1 | tee -a "$out" || status=1
if grep -q "SKIPPED \] Nvfp4LinearCuda" "$out"; then
  echo "gpu_check: the CUDA kernel test was skipped (no GPU visible?)" | tee -a "$out"
  status=1
fi
"$BUILD_DIR/bench/nvfp4_gemv_bench" --device cuda --batch 1,4,8,16 2>&1 | tee -a "$out" || status=1
# The kernel's configuration sweep (bench/nvfp4_gemv_variants.cu) and the streaming-read reference at several sizes.
nvcc -std=c++17 -arch=sm_90 -O3 -I src -I bench bench/nvfp4_gemv_variants.cu -o "$BUILD_DIR/nvfp4_gemv_variants" &&
  "$BUILD_DIR/nvfp4_gemv_variants" 2>&1 | tee -a "$out" || status=1
echo "gpu_check: results in $out (exit $status)"
exit $status
