#!/usr/bin/env bash
# On the GPU machine: training throughput of hybrid-250m and its single-family variants (issue 15's table).
# Each variant keeps hybrid-250m's dimensions and changes only the pattern; every run is `slm train` with BF16
# autocast, batch 16 x 1024, a few steps, and the steady state (steps after the first three) is reported:
# tokens/s, MFU (the trainer's own formula) and peak GPU memory.
#   SHARDS=out/gpu-shards bash bench/gpu_train_variants.sh       # BUILD_DIR=build-cuda (built beforehand)
#   BUILD_DIR=.devbin (scripts/device-bundle.sh) runs binaries built on a CPU machine.
# RECIPE=recipes/specialist-small.json VARIANTS=AEMEAEMEAEMR measures another recipe's dimensions the same way.
# BATCH=N sets the batch (sequences of 1024 tokens; default 16).
# PROFILE=N also profiles N steps of each run (slm train --profile-steps) and prints each summary after the table.
# TRACE_DIR=D copies each profiled run's Chrome trace to D/PATTERN-bBATCH.json.
# TRAIN_ARGS="--cuda-graph" passes more options to every `slm train`.
# Output: one table row per variant on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
SHARDS=${SHARDS:-out/gpu-shards}
STEPS=${STEPS:-12}
BATCH=${BATCH:-16}
PROFILE=${PROFILE:-0}
VARIANTS=${VARIANTS:-AEMEAEMEAEMR AF AE MF RF}
RECIPE=${RECIPE:-recipes/hybrid-250m.json}
work=$(mktemp -d)
printf '| pattern | batch | tokens/s | MFU | peak GPU memory |\n|---|---:|---:|---:|---:|\n'
for pattern in $VARIANTS; do
  python3 - "$pattern" "$work/$pattern.json" "$RECIPE" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
r["name"] = r["name"] + "-" + sys.argv[1]
r["pattern"] = sys.argv[1]
json.dump(r, open(sys.argv[2], "w"))
PY
  steps=$STEPS
  "$BUILD_DIR/slm" train --recipe "$work/$pattern.json" --data "$SHARDS" --out "$work/run-$pattern" --device cuda \
    --steps "$steps" --batch "$BATCH" --seq-len 1024 --warmup 2 --eval-every 0 --checkpoint-every 0 --log-every 1 \
    --profile-steps "$PROFILE" ${TRAIN_ARGS:-} \
    > "$work/$pattern.log" 2>&1 || { echo "| $pattern | $BATCH | failed: $(tail -1 "$work/$pattern.log") | | |"; continue; }
  # The trace is copied before anything is printed: a reader that stops early (| head) ends the script on SIGPIPE.
  if [[ -n ${TRACE_DIR:-} && -f $work/run-$pattern/profile/trace.json ]]; then
    mkdir -p "$TRACE_DIR"
    cp "$work/run-$pattern/profile/trace.json" "$TRACE_DIR/$pattern-b$BATCH.json"
  fi
  python3 - "$pattern" "$work/run-$pattern/metrics.jsonl" "$PROFILE" "$BATCH" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[2])) if "tokens_per_s" in r]
steady = rows[3 + int(sys.argv[3]):] or rows  # after the warm-up and the profiled steps
tps = sum(r["tokens_per_s"] for r in steady) / len(steady)
mfu = sum(r.get("mfu", 0) for r in steady) / len(steady)
mem = max(r.get("gpu_peak_gib", r.get("peak_gib", 0)) for r in rows)
print(f"| {sys.argv[1]} | {sys.argv[4]} | {tps:,.0f} | {100 * mfu:.1f}% | {mem:.1f} GiB |")
PY
done
for pattern in $VARIANTS; do
  f=$work/run-$pattern/profile/summary.txt
  if [[ -f $f ]]; then echo; echo "### $pattern"; cat "$f"; fi
done
