#!/usr/bin/env bash
# Issue #8 on the GPU machine: the held-out loss delta of hybrid-250m's NVFP4 checkpoint against the trained model.
# Trains with bench/gpu_train.sh for MINUTES (the trainer saves a checkpoint when the time is up or the steps are
# done), quantizes that checkpoint with `slm quantize`, scores the training checkpoint and the NVFP4 checkpoint with
# `slm eval --bf16` (BF16 autocast, as training computed) on the whole validation and test splits, and prints the
# loss per domain and pooled with NVFP4's relative delta.
#   SLM_DEPS_PREFIX=.deps/root MINUTES=5 bash bench/gpu_nvfp4_delta.sh
# Environment: BUILD_DIR, SHARDS, MINUTES, RUN, RECIPE, BATCH, SEQ as for gpu_train.sh; STEPS (default: about what
# fits in MINUTES, so that the LR schedule runs to its end); TRAIN=0 scores the run already in $RUN (trained
# elsewhere, e.g. on the CPU, then with DEVICE=cpu); EVAL_BATCH sequences per evaluation batch (16); EVAL_BATCHES
# per domain (default 100000: the whole split). The JSON of each evaluation is left in $RUN.
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-build-cuda} SHARDS=${SHARDS:-out/shards-v1} MINUTES=${MINUTES:-5}
export RUN=${RUN:-/tmp/gpu-nvfp4-run} RECIPE=${RECIPE:-recipes/hybrid-250m.json} SEQ=${SEQ:-1024}
# hybrid-250m at 16 x 1024 tokens took about 50 steps a minute on one H200 (bench/RESULTS.md): 45 leave room.
export STEPS=${STEPS:-$(python3 -c "import sys; print(max(1, int(45 * float(sys.argv[1]))))" "$MINUTES")}
export EVAL_EVERY=${EVAL_EVERY:-1000000}  # the evaluations below replace the trainer's
DEVICE=${DEVICE:-cuda}
EVAL_BATCH=${EVAL_BATCH:-16}
EVAL_BATCHES=${EVAL_BATCHES:-100000}

[[ ${TRAIN:-1} == 1 ]] && bash bench/gpu_train.sh
[[ -f $RUN/latest ]] || { echo "gpu_nvfp4_delta: $RUN has no checkpoint (no $RUN/latest)" >&2; exit 1; }
CKPT="$RUN/$(cat "$RUN/latest")"
SLM="$BUILD_DIR/slm"
t0=$SECONDS
"$SLM" quantize --recipe "$RECIPE" --in "$CKPT/model.safetensors" --out "$RUN/nvfp4.safetensors"
echo "quantized $CKPT in $((SECONDS - t0)) s"
for split in validation test; do
  common=(--split "$split" --batch "$EVAL_BATCH" --seq-len "$SEQ" --batches "$EVAL_BATCHES" --device "$DEVICE"
    --bf16 --json)
  t0=$SECONDS
  "$SLM" eval --checkpoint "$CKPT" "${common[@]}" > "$RUN/eval-bf16-$split.json"
  "$SLM" eval --checkpoint "$RUN/nvfp4.safetensors" --recipe "$RECIPE" --data "$SHARDS" "${common[@]}" \
    > "$RUN/eval-nvfp4-$split.json"
  echo "$split: both evaluations in $((SECONDS - t0)) s"
done

python3 - "$RUN" "$CKPT" <<'PY'
import json, sys
run, ckpt = sys.argv[1:]
print(f"checkpoint {ckpt} against its NVFP4 quantization, both under BF16 autocast")
print("| split | domain | tokens | trained loss / bpb | NVFP4 loss / bpb | NVFP4 loss vs trained |")
print("|---|---|---:|---:|---:|---:|")
for split in ("validation", "test"):
    b = json.load(open(f"{run}/eval-bf16-{split}.json"))
    n = json.load(open(f"{run}/eval-nvfp4-{split}.json"))
    assert n["nvfp4_weights"] > 0 and b["nvfp4_weights"] == 0, "the NVFP4 checkpoint must run NVFP4 weights"
    rows = sorted(b["domains"].items()) + [("all", b["all"])]
    for dom, s in rows:
        t = n["all"] if dom == "all" else n["domains"][dom]
        assert t["tokens"] == s["tokens"], f"{split}/{dom}: the two evaluations scored different windows"
        lb = lambda r: f"{r['loss']:.4f} / {r['bpb']:.4f}" if r["bpb"] is not None else f"{r['loss']:.4f} / -"
        print(f"| {split} | {dom} | {s['tokens']:,} | {lb(s)} | {lb(t)} | {100 * (t['loss'] / s['loss'] - 1):+.2f}% |")
print(f"step {b['step']}, {n['nvfp4_weights']} weights in NVFP4, windows of {b['seq_len']} tokens, batch {b['batch']}")
PY
