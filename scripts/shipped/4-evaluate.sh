#!/usr/bin/env bash
# Issue 20's figures that need a GPU and many cores, and issue 17's server on one GPU: the shipped ensemble served from
# one GPU with every model resident (`slm serve --device cuda`), a load test against it, then HumanEval-C++ pass@1 and
# pass@10, compile-pass and context adherence on a held-out package, each through the server's HTTP API for the cpp
# specialist, the generalist and the routed ensemble (model auto). Runs the CUDA binary built on the CPU machine.
#
# models/ (116 MiB) does not fit in one call (64 MiB travel), so it goes in parts to a warm machine, one call each
# (back to back: the machine keeps /tmp between calls only while it is warm):
#   bash scripts/shipped/4-evaluate.sh stage      # every call: copies the carried .devrun/m*/ to $S/models
#   bash scripts/shipped/4-evaluate.sh humaneval  # then the runs, given as further arguments: load humaneval code
# Carried: .devrun/devbin.tar.xz (scripts/device-bundle.sh), .devrun/heldout.tar.xz (capnproto's src/ from the held-out
# test split), .devrun/humaneval-cpp.jsonl (../shared/eval/multipl-e), .devrun/m1 .. m3 (parts of models/: each model's directory, ensemble.json, router.bin).
set -uo pipefail
S=/tmp/ship-eval
mkdir -p $S/models
N=${N:-20}  # samples per HumanEval problem
for part in .devrun/m*/; do [[ -d $part ]] && cp -r $part. $S/models/; done
[[ -f .devrun/devbin.tar.xz && ! -d $S/.devbin ]] && tar -xJf .devrun/devbin.tar.xz -C $S
[[ -f .devrun/heldout.tar.xz && ! -d $S/heldout ]] && mkdir -p $S/heldout && tar -xJf .devrun/heldout.tar.xz -C $S/heldout
echo "staged: $(ls $S/models | tr '\n' ' ')"
[[ "${1:-}" == stage ]] && shift
(($#)) || exit 0

source $S/.devbin/env.sh
SLM=$S/.devbin/slm
mkdir -p models && cp -r $S/models/. models/  # the working tree's models/ was left out of the call
$SLM ensemble verify models/ensemble.json --strict || exit 3
nproc
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
export CUDA_VISIBLE_DEVICES=0
URL=http://127.0.0.1:8000
$SLM serve --device cuda --slots 64 --max-queue 1024 --quiet > $S/serve.log 2>&1 &
SERVER=$!
for i in $(seq 120); do curl -sf $URL/health > /dev/null && break; sleep 1; done
head -20 $S/serve.log
nvidia-smi --query-gpu=memory.used --format=csv,noheader
curl -s $URL/metrics | grep -E "^slm_(cuda|process)" | tee $OUT/memory.txt
HELD=$S/heldout/src  # capnproto: kj (self-contained) for the held-out code figures
JOBS=$(( $(nproc) / 3 ))
for run in "$@"; do
  case $run in
    load)
      for m in "--model auto --mixed" "--model cpp"; do
        python3 bench/serve_load.py --url $URL --clients 16 --requests 50 --max-tokens 64 $m | tee -a $OUT/load.txt
      done
      curl -s $URL/metrics | grep -E "^slm_(requests|generated|specialist)" >> $OUT/load.txt ;;
    humaneval)
      pids=()
      for m in cpp generalist auto; do
        $SLM eval humaneval --problems .devrun/humaneval-cpp.jsonl --model $URL --server-model $m --n $N --k 1,10 \
          --temperature 0.8 --top-p 0.95 --seed 1 --max-tokens ${MAXTOK:-256} --parallel 64 --jobs $JOBS \
          --out $S/he-$m > $S/he-$m.txt 2> $S/he-$m.err &
        pids+=($!)
      done
      wait "${pids[@]}"
      for m in cpp generalist auto; do echo "== $m"; cat $S/he-$m.txt; tail -2 $S/he-$m.err; done ;;
    humaneval-rest)  # the problems a humaneval run cut short by the call's time limit did not reach (same seeds)
      pids=()
      for m in cpp generalist auto; do
        rest=$(python3 -c "
import json, sys
done = {json.loads(l)['task_id'] for l in open('$S/he-$m/results.jsonl')}
print(','.join(json.loads(l)['name'] for l in open('.devrun/humaneval-cpp.jsonl') if json.loads(l)['name'] not in done))")
        [[ -z $rest ]] && continue
        $SLM eval humaneval --problems .devrun/humaneval-cpp.jsonl --tasks $rest --model $URL --server-model $m \
          --n $N --k 1,10 --temperature 0.8 --top-p 0.95 --seed 1 --max-tokens ${MAXTOK:-256} --parallel 64 \
          --jobs $JOBS --out $S/he-$m-rest > $S/he-$m-rest.txt 2> $S/he-$m-rest.err &
        pids+=($!)
      done
      wait "${pids[@]}" ;;
    code)
      pids=()
      for m in cpp generalist auto; do
        ( $SLM eval compile-pass --files $HELD/kj -I $HELD --model $URL --server-model $m --parallel 32 --jobs $JOBS \
            --max-prompt-bytes 900 --max-tokens 256 \
            --out $S/cp-$m > $S/cp-$m.txt 2> $S/cp-$m.err
          $SLM eval context --files $HELD/kj -I $HELD --model $URL --server-model $m --parallel 32 \
            --out $S/ctx-$m > $S/ctx-$m.txt 2> $S/ctx-$m.err ) &
        pids+=($!)
      done
      wait "${pids[@]}"
      for m in cpp generalist auto; do echo "== $m"; cat $S/cp-$m.txt $S/ctx-$m.txt; tail -n 2 $S/cp-$m.err $S/ctx-$m.err; done ;;
  esac
done
kill $SERVER 2> /dev/null
cd $S && tar -czf $OUT/eval.tgz he-* cp-* ctx-* serve.log 2> /dev/null; ls -la $OUT
