#!/usr/bin/env bash
# On the GPU machine (issue 16): NVFP4 decode from CUDA graphs, now that the routed experts gather by id on the device.
# Batch-1 and batch-64 decode of random-weight models in BF16 (graph), NVFP4 eager (the path NVFP4 models took before)
# and NVFP4 from a graph, the LM head in NVFP4 too; then the engine with 64 clients, NVFP4 eager against graphs.
#   SLM_DEPS_PREFIX=.deps/root bash bench/gpu_nvfp4_decode.sh           # builds build-cuda, runs the GPU tests
#   SKIP_BUILD=1 RECIPES="specialist-shipped hybrid-250m" BATCHES="1 64" bash bench/gpu_nvfp4_decode.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
RECIPES=${RECIPES:-"specialist-shipped hybrid-250m"}
BATCHES=${BATCHES:-"1 64"}
if [[ -z "${SKIP_BUILD:-}" ]]; then
  SLM_CUDA=ON BUILD_DIR="$BUILD_DIR" SLM_TARGET=slm bash scripts/setup.sh >/dev/null || exit 1
  cmake --build "$BUILD_DIR" --target slm_tests decode_bench engine_bench >/dev/null || exit 1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$BUILD_DIR/tests/slm_tests" --gtest_filter='Nvfp4*:MoE*:CudaModel*:GraphDecoder*:BatchEngine*:Decode*:Speculative*' \
    2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure|error" | head -40
fi
[[ -n "${SKIP_BENCH:-}" ]] && exit 0
B="$BUILD_DIR/bench/decode_bench"
for r in $RECIPES; do
  for n in $BATCHES; do
    for mode in "--graph" "--nvfp4" "--nvfp4 --graph" "--nvfp4 --quantize-head --graph"; do
      echo "== $r batch $n $mode"
      "$B" --recipe "recipes/$r.json" --device cuda --dtype bf16 --steps 48 --batch "$n" $mode 2>&1
    done
  done
done
E="$BUILD_DIR/bench/engine_bench"
for r in $RECIPES; do
  for mode in "--no-graph" ""; do
    echo "== engine $r --nvfp4 --quantize-head $mode"
    "$E" --recipe "recipes/$r.json" --device cuda --dtype bf16 --nvfp4 --quantize-head --requests 64 --slots 64 \
      --prompt-tokens 128 --max-tokens 128 --serial-requests 4 $mode 2>&1
  done
done
