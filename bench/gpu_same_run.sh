#!/usr/bin/env bash
# On the GPU machine: a change measured against the commit before it in one run. OLD is a copy of the older sources
# (made here with `git archive REV | tar -x -C old`, carried as untracked files); both trees build with SLM_CUDA=ON,
# then the benches of both run alternately on the same GPU: batch-1 and batch-16 decode from CUDA graphs (BF16, and
# NVFP4 for specialist-small), the MoE layer's training forward and backward, and `slm train` of hybrid-250m on shards
# of this repository's own sources (the data's content does not change a step's time). One phase per device call:
#   SLM_DEPS_PREFIX=.deps/root bash bench/gpu_same_run.sh build    # both builds, in parallel
#   bash bench/gpu_same_run.sh test                                # the GPU tests of the new build
#   bash bench/gpu_same_run.sh bench                               # old and new, alternating
# OLD=old, NEW_BUILD=build-cuda, OLD_BUILD=/tmp/old-build-cuda; TESTS=gtest filter; ROUNDS=2; output on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${OLD:-old}
NEW_BUILD=${NEW_BUILD:-build-cuda}
OLD_BUILD=${OLD_BUILD:-/tmp/old-build-cuda}  # outside OLD: a device call that carries OLD replaces it
TARGETS="slm slm_tests decode_bench moe_bench"
phase=${1:?usage: gpu_same_run.sh build|test|bench}

DEPS=$(realpath "${SLM_DEPS_PREFIX:-.deps/root}")

case $phase in
  build)
    nproc
    # setup.sh builds every default target; the two trees share the cores.
    # OLD's grammar is this tree's (.deps is git-ignored, so git archive left it out).
    ln -sfn "$PWD/.deps" "$OLD/.deps"
    (cd "$OLD" && SLM_DEPS_PREFIX="$DEPS" SLM_CUDA=ON BUILD_DIR="$OLD_BUILD" SLM_TARGET=slm \
      bash scripts/setup.sh > /tmp/old-build.log 2>&1 &&
      cmake --build "$OLD_BUILD" --target slm decode_bench moe_bench -j 7 >> /tmp/old-build.log 2>&1) &
    old_pid=$!
    SLM_DEPS_PREFIX="$DEPS" SLM_CUDA=ON BUILD_DIR="$NEW_BUILD" SLM_TARGET=slm bash scripts/setup.sh > /tmp/new-build.log 2>&1 &&
      cmake --build "$NEW_BUILD" --target $TARGETS -j 9 >> /tmp/new-build.log 2>&1 || { tail -30 /tmp/new-build.log; exit 1; }
    wait $old_pid || { tail -30 /tmp/old-build.log; exit 1; }
    echo "both builds done"
    ;;
  test)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$NEW_BUILD/tests/slm_tests" --gtest_brief=1 \
      --gtest_filter="${TESTS:-*Cuda*:MoE*:Mamba3*:DecodeFusions*:GraphDecoder*:BatchEngine*:CudaModel*:Nvfp4Model*:Decode*:Speculative*:GraphStep*:Recompute*:BackendSummary*}"
    ;;
  bench)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    shards=/tmp/same-run-shards
    [[ -d $shards ]] || "$NEW_BUILD/slm" data shard --input src --out "$shards" > /dev/null
    for round in $(seq "${ROUNDS:-2}"); do
      for side in ${SIDES:-new old}; do
        if [[ $side == new ]]; then b=$NEW_BUILD; else b=$OLD_BUILD; fi
        echo "== round $round: $side"
        for r in hybrid-250m specialist-small; do
          for batch in 1 16; do
            "$b/bench/decode_bench" --recipe "recipes/$r.json" --device cuda --dtype bf16 --steps 64 --batch "$batch" \
              --graph 2>&1 | awk '/prefill ms/ {getline; print}' | sed "s/^/b$batch graph: /"
          done
        done
        "$b/bench/decode_bench" --recipe recipes/specialist-small.json --device cuda --dtype bf16 --steps 64 --nvfp4 \
          --graph 2>&1 | awk '/prefill ms/ {getline; print}' | sed "s/^/b1 graph nvfp4: /"
        "$b/bench/moe_bench" 16384 20 2>&1 | grep "whole layer"
        run=/tmp/same-run-$side-$round
        rm -rf "$run"
        "$b/slm" train --recipe recipes/hybrid-250m.json --data "$shards" --out "$run" --device cuda --steps 10 \
          --batch 16 --seq-len 1024 --warmup 2 --eval-every 0 --checkpoint-every 0 > "$run.log" 2>&1 ||
          { tail -5 "$run.log"; continue; }
        python3 - "$run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
steady = rows[3:] or rows
print("slm train hybrid-250m b16x1024: %.0f tokens/s (mean of %d steps after the first 3)" %
      (sum(r["tokens_per_s"] for r in steady) / len(steady), len(steady)))
PY
      done
    done
    ;;
esac
