#!/usr/bin/env bash
# On the GPU machine: build with SLM_CUDA=ON, run the decode tests that need a GPU (the decode attention kernel, the
# device-side step, CUDA graph replay) and time batch-1 decode of whole recipes, eager and from a CUDA graph.
#   bash bench/gpu_decode.sh            # BUILD_DIR=build-cuda; set SLM_DEPS_PREFIX as for scripts/setup.sh
#   RECIPES="hybrid-250m specialist-small" PROFILE=1 BATCHES="8 64" bash bench/gpu_decode.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
RECIPES=${RECIPES:-"hybrid-250m specialist-small tiny-hybrid"}
SLM_CUDA=ON BUILD_DIR="$BUILD_DIR" bash scripts/setup.sh
cmake --build "$BUILD_DIR" --target decode_bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
"$BUILD_DIR/tests/slm_tests" --gtest_filter='DecodeAttention*:CudaModel*:GraphDecoder*:Decode.*:MoE*:Mamba3StepCuda*'
B="$BUILD_DIR/bench/decode_bench"
for r in $RECIPES; do
  "$B" --recipe "recipes/$r.json" --device cuda --dtype bf16 --steps 48
  "$B" --recipe "recipes/$r.json" --device cuda --dtype bf16 --steps 48 --graph
done
for n in ${BATCHES:-}; do  # aggregate tokens/s of n sequences decoded together, from the graph
  "$B" --recipe recipes/hybrid-250m.json --device cuda --dtype bf16 --steps 48 --batch "$n" --graph
done
if [[ -n "${PROFILE:-}" ]]; then
  "$B" --recipe recipes/hybrid-250m.json --device cuda --dtype bf16 --steps 16 --graph --profile
fi
