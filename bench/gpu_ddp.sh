#!/usr/bin/env bash
# On a machine with 2 GPUs: build slm with SLM_CUDA=ON, then train the ~250M hybrid recipe data-parallel on 2 GPUs
# (slm train --nproc 2, NCCL) and on 1 GPU with the same global batch (the second micro-batch by --accum 2), and
# print both runs' tokens/s, the speed-up and their loss curves side by side (issue 7's scaling figure). The 1-GPU
# run is also the single-GPU figure (tokens/s, MFU) when MIN1 >= 5.
#   SHARDS=out/shards-v1 MIN2=2 MIN1=5 bash bench/gpu_ddp.sh      # BUILD_DIR=build-cuda; SLM_DEPS_PREFIX as for setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
SHARDS=${SHARDS:-out/shards-v1}
RECIPE=${RECIPE:-recipes/hybrid-250m.json}
BATCH=${BATCH:-16}  # sequences per GPU per micro-batch
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # the machines' rule: no NVLink multicast

SLM_CUDA=ON BUILD_DIR="$BUILD_DIR" SLM_TARGET=slm bash scripts/setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
common=(--recipe "$RECIPE" --data "$SHARDS" --device cuda --steps "${STEPS:-2000}" --seq-len "${SEQ:-1024}" --warmup 50
  --eval-every "${EVAL_EVERY:-100}" --eval-batches 2 --checkpoint-every 0 --log-every 1)
rm -rf /tmp/ddp-2gpu /tmp/ddp-1gpu
"$BUILD_DIR/slm" train "${common[@]}" --out /tmp/ddp-2gpu --batch $((2 * BATCH)) --nproc 2 --max-minutes "${MIN2:-2}"
"$BUILD_DIR/slm" train "${common[@]}" --out /tmp/ddp-1gpu --batch "$BATCH" --accum 2 --max-minutes "${MIN1:-5}"
python3 - /tmp/ddp-1gpu/metrics.jsonl /tmp/ddp-2gpu/metrics.jsonl <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p)]
    train = {r["step"]: r for r in rows if "loss" in r}
    evals = {r["step"]: r["eval"] for r in rows if "eval" in r}
    return train, evals
def steady(train):
    steps = sorted(train)[len(train) // 5:] or sorted(train)
    return sum(train[s]["tokens_per_s"] for s in steps) / len(steps), sum(train[s].get("mfu", 0) for s in steps) / len(steps)
(t1, e1), (t2, e2) = load(sys.argv[1]), load(sys.argv[2])
(tps1, mfu1), (tps2, mfu2) = steady(t1), steady(t2)
print(f"1 GPU : {max(t1)} steps, {tps1:,.0f} tokens/s, MFU {100 * mfu1:.1f}%, loss {t1[min(t1)]['loss']:.3f} -> {t1[max(t1)]['loss']:.3f}")
print(f"2 GPUs: {max(t2)} steps, {tps2:,.0f} tokens/s, MFU {100 * mfu2:.1f}% (per GPU), loss {t2[min(t2)]['loss']:.3f} -> {t2[max(t2)]['loss']:.3f}")
print(f"speed-up 2 GPUs / 1 GPU: {tps2 / tps1:.2f}x (same global batch, steady state = last 80% of steps)")
common = sorted(set(t1) & set(t2))
diffs = [abs(t1[s]["loss"] - t2[s]["loss"]) for s in common]
print(f"loss over the {len(common)} common steps: mean |1 GPU - 2 GPUs| {sum(diffs) / len(diffs):.4f}, max {max(diffs):.4f}")
for s in common[:: max(1, len(common) // 12)]:
    print(f"  step {s:5d}  1 GPU {t1[s]['loss']:.4f}  2 GPUs {t2[s]['loss']:.4f}")
for s in sorted(set(e1) & set(e2)):
    print("  eval step", s, {d: (round(e1[s][d]["loss"], 3), round(e2[s][d]["loss"], 3)) for d in e1[s]})
PY
