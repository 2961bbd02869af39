#!/usr/bin/env bash
# On the GPU machine: train a recipe for a fixed wall time that may span several device calls (each at most 10
# minutes), for issue 15's comparison of the same minutes of training before and after the speed work. Each call runs
# one segment of at most SEGMENT minutes (or until DEADLINE, epoch seconds); the next call (the machine still warm,
# RUN outside the repository) resumes.
#   BIN=.devbin/slm DATA=pack.slmpack RUN=/tmp/runs/after MINUTES=20 SEGMENT=8 bash bench/gpu_train_minutes.sh
# The first call measures the program's tokens/s in a short probe run and sets --steps so that the WSD schedule ends
# with the time; the call in which the steps or the minutes run out scores the run on the validation split of every
# domain (slm eval, BF16 as trained) into RUN/eval-validation.json and RUN/eval-test.json. Prints "done" then.
# BIN may be an older build of slm (it needs train --max-minutes/--resume and eval); DATA a pack or shard directory.
set -euo pipefail
: "${BIN:?}" "${DATA:?}" "${RUN:?}"
RECIPE=${RECIPE:-recipes/specialist-small.json}
MINUTES=${MINUTES:-20}
SEGMENT=${SEGMENT:-9}
BATCH=${BATCH:-64}
SEQ=${SEQ:-1024}  # small validation splits (a few thousand tokens) must hold one window of SEQ + 1
EVALS=${EVALS:-10}          # validation points over the run
EVAL_BATCHES=${EVAL_BATCHES:-2}
PROBE_STEPS=${PROBE_STEPS:-12}
TRAIN_ARGS=${TRAIN_ARGS:-}  # more options of the first slm train, e.g. --mix cpp=4 --mix cmake=1

mkdir -p "$(dirname "$RUN")"
spent=$(cat "$RUN.spent_s" 2>/dev/null || echo 0)
if [[ ! -f $RUN.steps ]]; then
  rm -rf "$RUN" "$RUN.probe"
  "$BIN" train --recipe "$RECIPE" --data "$DATA" --out "$RUN.probe" --device "${DEVICE:-cuda}" --steps "$PROBE_STEPS" \
    --batch "$BATCH" --seq-len "$SEQ" --eval-every 0 --eval-batches 1 --checkpoint-every 0 $TRAIN_ARGS \
    >"$RUN.probe.log" 2>&1
  # Steps for the minutes at the probe's steady rate (its second half); 8% kept for start-up, evaluations, checkpoints.
  python3 - "$RUN.probe/metrics.jsonl" "$MINUTES" "$((BATCH * SEQ))" >"$RUN.steps" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
rate = statistics.median(rates[len(rates) // 2:])
print(max(10, int(rate * float(sys.argv[2]) * 60 * 0.92 / int(sys.argv[3]))))
PY
  echo "probe: $(tr '\r' '\n' <"$RUN.probe.log" | grep 'tok/s' | tail -1); steps for $MINUTES min: $(cat "$RUN.steps")"
fi
steps=$(cat "$RUN.steps")
# This call's share: SEGMENT minutes, or up to DEADLINE (epoch seconds; 30 s kept for saving and scoring) if earlier.
left=$(python3 -c "
d = ${DEADLINE:-0}
import time
s = min($SEGMENT * 60, $MINUTES * 60 - $spent, d - time.time() - 30 if d else 1e9)
print(max(0.0, s) / 60)")
last_step() { python3 -c "
import json, sys
steps = [json.loads(l).get('step', 0) for l in open(sys.argv[1])]
print(max(steps) if steps else 0)" "$RUN/metrics.jsonl" 2>/dev/null || echo 0; }
if [[ $(last_step) -lt $steps ]] && python3 -c "import sys; sys.exit(0 if $left > 0.05 else 1)"; then
  t0=$(date +%s.%N)
  if [[ -d $RUN ]]; then
    "$BIN" train --resume "$RUN" --max-minutes "$left" >>"$RUN.log" 2>&1
  else
    "$BIN" train --recipe "$RECIPE" --data "$DATA" --out "$RUN" --device "${DEVICE:-cuda}" --steps "$steps" \
      --batch "$BATCH" --seq-len "$SEQ" --warmup $((steps / 50 + 1)) --eval-every $((steps / EVALS + 1)) \
      --eval-batches "$EVAL_BATCHES" --checkpoint-every 0 --max-minutes "$left" $TRAIN_ARGS >"$RUN.log" 2>&1
  fi
  python3 -c "print($spent + $(date +%s.%N) - $t0)" >"$RUN.spent_s"
fi
spent=$(cat "$RUN.spent_s" 2>/dev/null || echo 0)
echo "$RUN: step $(last_step) of $steps after $(python3 -c "print(round($spent / 60, 2))") minutes"
if [[ $(last_step) -ge $steps ]] || python3 -c "import sys; sys.exit(0 if $spent >= $MINUTES * 60 - 3 else 1)"; then
  for split in validation test; do  # a small domain may have no validation documents but some test ones
    [[ -f $RUN/eval-$split.json ]] ||
      "$BIN" eval --checkpoint "$RUN" --device "${DEVICE:-cuda}" $([[ ${DEVICE:-cuda} == cuda ]] && echo --bf16) \
        --split $split --batches "${FINAL_EVAL_BATCHES:-8}" --json >"$RUN/eval-$split.json" 2>"$RUN.eval-$split.log"
  done
  echo done
fi
