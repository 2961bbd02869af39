#!/usr/bin/env bash
# On the GPU machine: build with SLM_CUDA=ON, run the engine tests (continuous batching with CUDA graph buckets among
# them) and time many concurrent requests through continuous batching against one request at a time.
#   bash bench/gpu_engine.sh            # BUILD_DIR=build-cuda; set SLM_DEPS_PREFIX as for scripts/setup.sh
#   RECIPES="hybrid-250m" REQUESTS=64 bash bench/gpu_engine.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
RECIPES=${RECIPES:-"hybrid-250m specialist-small"}
REQUESTS=${REQUESTS:-64}
SLM_CUDA=ON BUILD_DIR="$BUILD_DIR" bash scripts/setup.sh
cmake --build "$BUILD_DIR" --target engine_bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
"$BUILD_DIR/tests/slm_tests" --gtest_filter='BatchEngine*:DecodeStateRows*:Engine*:GraphDecoder*'
for r in $RECIPES; do
  "$BUILD_DIR/bench/engine_bench" --recipe "recipes/$r.json" --device cuda --dtype bf16 --requests "$REQUESTS" \
    --slots "$REQUESTS" --prompt-tokens 128 --max-tokens 128 --serial-requests 4
done
