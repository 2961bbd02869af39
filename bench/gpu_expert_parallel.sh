#!/usr/bin/env bash
# On a machine with several GPUs (issues 21 and 15): expert parallelism against plain data parallelism, and full-size
# NAM56R on one and on several GPUs.
# tokens/s and MFU are the median step's after the first three.
#   1. hybrid-250m on NGPU GPUs, data-parallel (--expert-parallel 1) and with its 16 experts spread over all of them
#      (--expert-parallel NGPU), the same global batch: tokens/s, peak memory of rank 0, and the first steps' losses
#      side by side (the same model and data: they agree to BF16 rounding). With RECOMPUTE=1 also the data-parallel
#      run with activation checkpointing (the same losses, more compute, less memory).
#   2. Full-size NAM56R (recipes/nam56r.json, 4.73B) with its experts spread over each count of GPUs in EPS (1: one
#      GPU, no spreading), batch 1 per GPU at SEQ tokens, activation checkpointing with RECOMPUTE=1: tokens/s,
#      model TFLOP/s per GPU (the trainer's FLOP count), peak memory of rank 0, and with PROFILE=N the kernel table of
#      N profiled steps (the NCCL kernels are the all-to-alls and the gradient reductions).
#      ACCUM=N accumulates N micro-batches per optimizer step (Muon's Newton-Schulz then runs once per N).
#   SHARDS=out/ep-shards NGPU=4 EPS="1 2 4" SEQ=2048 RECOMPUTE=1 bash bench/gpu_expert_parallel.sh   # built beforehand
# Output: one table row per run on stdout; each run's log under $WORK (default a fresh temporary directory). A run
# that fails (out of memory, say) prints its last log lines in its row; each run is cut off after LIMIT seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
SHARDS=${SHARDS:-out/ep-shards}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
EPS=${EPS:-"1 2 4"}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-8}
ACCUM=${ACCUM:-1}
SMALL=${SMALL:-1}    # 0 skips part 1
PROFILE=${PROFILE:-0}
RECOMPUTE=${RECOMPUTE:-1}
LIMIT=${LIMIT:-300}
ckpt=(); [[ $RECOMPUTE == 1 ]] && ckpt=(--recompute)
WORK=${WORK:-$(mktemp -d)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the machines' rule
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c

report() {  # name, run directory, GPUs, log
  python3 - "$@" <<'PY'
import json, sys
name, run, gpus, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    rows = [r for r in map(json.loads, open(run + "/metrics.jsonl")) if "tokens_per_s" in r]
except FileNotFoundError:
    rows = []
if not rows:
    tail = [l.strip() for l in open(log) if l.strip()][-2:]
    print(f"| {name} | {gpus} | failed: {' / '.join(tail)[:300]} | | | | |")
    sys.exit()
steady = sorted(rows[3:] or rows, key=lambda r: r["tokens_per_s"])  # the median step after the first three
tps = steady[len(steady) // 2]["tokens_per_s"]
mfu = steady[len(steady) // 2].get("mfu", 0)
mem = max(r.get("gpu_peak_gib", 0) for r in rows)
losses = " ".join(f"{r['loss']:.4f}" for r in rows[:4])
# The trainer's MFU is model FLOPs / (peak x GPUs); its peak for H100/H200 SXM is 989 dense BF16 TFLOP/s.
print(f"| {name} | {gpus} | {tps:,.0f} | {mfu * 989:.1f} | {100 * mfu:.2f}% | {mem:.1f} GiB | {losses} |")
PY
}

printf '| run | GPUs | tokens/s | model TFLOP/s per GPU | MFU | peak memory (rank 0) | first losses |\n'
printf '|---|---:|---:|---:|---:|---:|---|\n'
if [[ $SMALL == 1 ]]; then
  runs=("1" "$NGPU"); [[ $RECOMPUTE == 1 ]] && runs+=("1 --recompute")
  for r in "${runs[@]}"; do
    set -- $r
    name=h250m-ep$1${2:+-recompute}
    timeout "$LIMIT" "$BUILD_DIR/slm" train --recipe recipes/hybrid-250m.json --data "$SHARDS" --out "$WORK/$name" \
      --device cuda --steps 12 --batch $((16 * NGPU)) --seq-len 1024 --warmup 2 --eval-every 0 --checkpoint-every 0 \
      --seed 3 --nproc "$NGPU" --expert-parallel "$@" > "$WORK/$name.log" 2>&1 || true
    report "hybrid-250m, expert-parallel $1${2:+, recompute}" "$WORK/$name" "$NGPU" "$WORK/$name.log"
  done
fi
for ep in $EPS; do
  name=nam56r-ep$ep
  spread=(--nproc "$ep" --expert-parallel "$ep"); [[ $ep == 1 ]] && spread=()
  timeout "$LIMIT" "$BUILD_DIR/slm" train --recipe recipes/nam56r.json --data "$SHARDS" --out "$WORK/$name" \
    --device cuda --steps "$STEPS" --batch "$ep" --seq-len "$SEQ" --accum "$ACCUM" --warmup 2 --eval-every 0 \
    --checkpoint-every 0 --seed 3 "${spread[@]}" "${ckpt[@]}" --profile-steps "$PROFILE" > "$WORK/$name.log" 2>&1 || true
  report "NAM56R at $SEQ tokens x $ACCUM, expert-parallel $ep${ckpt:+, recompute}" "$WORK/$name" "$ep" "$WORK/$name.log"
done
for ep in $EPS; do
  f=$WORK/nam56r-ep$ep/profile/summary.txt
  [[ -f $f ]] && { echo; echo "### NAM56R, expert-parallel $ep (rank 0)"; head -40 "$f"; }
done
echo "logs: $WORK"
