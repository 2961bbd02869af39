#!/usr/bin/env bash
# Issue 20, call 2: from the base of call 1, the generalist (GPUs 0-1, data-parallel, the union of the domains, 8x a
# specialist's tokens) and the eight specialists (GPUs 2 and 3, one after another, each on its own domain), then
# NVFP4 quantization and held-out loss of each model in FP32 and NVFP4.
set -uo pipefail
S=/tmp/ship
[[ -d $S/runs/base ]] || { echo "no $S/runs/base: the machine of call 1 was not kept"; exit 3; }
source $S/.devbin/env.sh
SLM=$S/.devbin/slm
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DATA=$S/ship-00000.slmpack.d
T=${T:-400}  # seconds of training per GPU
# The base's tokens/s per GPU (median of its logged steps after the first five) sizes the budgets to T.
R=$(python3 -c "
import json
rows=[json.loads(l) for l in open('$S/runs/base/metrics.jsonl')]
r=sorted(x['tokens_per_s'] for x in rows if 'tokens_per_s' in x)[5:] or [1e5]
print(int(r[len(r)//2]/$(nvidia-smi -L | wc -l)))")
B=$(( R * T / 4 / 32768 * 32768 ))   # a specialist's tokens; the generalist gets 8 B on 2 GPUs (4 B each)
echo "base: $R tokens/s per GPU -> specialist budget B = $B tokens, generalist 8B = $((8 * B))"
declare -A DOMAIN_TOKENS=([cpp]=47185619 [design]=27265962 [cmake]=23663211 [shell]=16068996 [algorithm]=7091659
                          [review]=1016109 [orchestration]=483620 [debug]=177928)
MIX="--mix cpp=4 --mix design=2 --mix cmake=1.5 --mix shell=1 --mix algorithm=0.5 --mix review=0.15 --mix orchestration=0.1 --mix debug=0.05"
COMMON="--recipe $S/specialist-shipped.json --data $DATA --init $S/runs/base --device cuda --seq-len 1024 --warmup 10
  --decay-fraction 0.5 --eval-every 0 --eval-batches 8 --checkpoint-every 0 --keep-last 1
  --tokenizer $S/slm-code-8k.model --log-every 5"
deadline=$(( $(date +%s) + T + 40 ))
minutes_left() { python3 -c "print(max(0.5, ($deadline - $(date +%s)) / 60))"; }
echo "start $(date +%T)"
CUDA_VISIBLE_DEVICES=0,1 $SLM train $COMMON --nproc 2 --batch 64 --tokens $((8 * B)) $MIX --out $S/runs/generalist \
  --max-minutes $(minutes_left) > $S/generalist.log 2>&1 &
specialist() {  # gpu domain: at most 4 epochs of the domain
  local n=$(( 4 * ${DOMAIN_TOKENS[$2]} )); local budget=$(( n < B ? n : B ))
  CUDA_VISIBLE_DEVICES=$1 $SLM train $COMMON --batch 32 --domains $2 --tokens $budget --out $S/runs/$2 \
    --max-minutes $(minutes_left) > $S/$2.log 2>&1
  echo "$2: exit $? at $(date +%T), budget $budget"
}
( for d in cpp design cmake; do specialist 2 $d; done ) &
( for d in shell algorithm review orchestration debug; do specialist 3 $d; done ) &
wait
echo "trained at $(date +%T)"
mkdir -p $S/q $OUT/runs
names="cpp design cmake shell algorithm review orchestration debug generalist"
for n in $names; do
  ck=$(cat $S/runs/$n/latest 2>/dev/null) || { echo "$n: no checkpoint"; continue; }
  $SLM quantize --recipe $S/specialist-shipped.json --in $S/runs/$n/$ck/model.safetensors --out $S/q/$n.safetensors \
    --quantize-head --quantize-embedding --json > $S/q/$n.quant.json 2>&1 || echo "$n: quantize failed"
done
i=0
for n in $names; do
  gpu=$(( i % 4 )); i=$((i + 1))
  ( CUDA_VISIBLE_DEVICES=$gpu $SLM eval --checkpoint $S/runs/$n --data $DATA --domains cpp,design,cmake,shell,algorithm,review,orchestration,debug --device cuda --batches 16 --json > $S/q/$n.eval-fp32.json 2>$S/q/$n.eval.err
    CUDA_VISIBLE_DEVICES=$gpu $SLM eval --checkpoint $S/q/$n.safetensors --recipe $S/specialist-shipped.json --data $DATA --domains cpp,design,cmake,shell,algorithm,review,orchestration,debug --tokenizer $S/slm-code-8k.model --device cuda --batches 16 --json > $S/q/$n.eval-nvfp4.json 2>>$S/q/$n.eval.err ) &
  (( i % 4 == 0 )) && wait
done
wait
echo "evaluated at $(date +%T)"
for n in $names; do
  mkdir -p $OUT/runs/$n
  cp $S/runs/$n/metrics.jsonl $S/runs/$n/config.json $S/q/$n.*.json $S/q/$n.eval.err $OUT/runs/$n/ 2>/dev/null
  tr '\r' '\n' < $S/$n.log | grep -v "^step" > $OUT/runs/$n/train.log
done
for n in cpp design cmake shell; do cp $S/q/$n.safetensors $OUT/ 2>/dev/null; done
ls -la $S/q
