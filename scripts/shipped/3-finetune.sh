#!/usr/bin/env bash
# Issue 20, call 3: the specialists fine-tuned from the generalist (its NVFP4 weights, dequantized) on their own
# domain at a quarter of the LR, at most two epochs or 12M tokens; the control: the generalist continued on the union
# for the same total tokens at the same LR. Then NVFP4 quantization and held-out loss of each, FP32 and NVFP4.
set -uo pipefail
S=/tmp/ship
mkdir -p $S && tar -xJf .devrun/devbin.tar.xz -C $S
source $S/.devbin/env.sh
SLM=$S/.devbin/slm
cp out/ship-pack/ft-00000.slmpack out/ship-pack/generalist.safetensors tokenizer/slm-code-8k.model recipes/specialist-shipped.json $S/
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DATA=$S/ft-00000.slmpack
declare -A DOMAIN_TOKENS=([cpp]=10417261 [design]=19635274 [cmake]=11601000 [shell]=16068996 [algorithm]=7091659
                          [review]=1016109 [orchestration]=483620 [debug]=177928)
CAP=12000000
LR="--optim matrix_lr=0.005 --optim embed_lr=0.075 --optim head_lr=0.002 --optim router_lr=0.00125 --optim norm_lr=0.00125
  --optim vector_lr=0.00125 --optim scalar_lr=0.00125 --optim muon_momentum_start=0.95"
MIX="--mix cpp=4 --mix design=2 --mix cmake=1.5 --mix shell=1 --mix algorithm=0.5 --mix review=0.15 --mix orchestration=0.1 --mix debug=0.05"
COMMON="--recipe $S/specialist-shipped.json --data $DATA --init $S/generalist.safetensors --device cuda --seq-len 1024
  --warmup 5 --decay-fraction 0.9 --eval-every 0 --eval-batches 8 --checkpoint-every 0 --keep-last 1
  --tokenizer $S/slm-code-8k.model --log-every 5 $LR"
deadline=$(( $(date +%s) + ${T:-260} ))
minutes_left() { python3 -c "print(max(0.5, ($deadline - $(date +%s)) / 60))"; }
total=0; declare -A BUDGET
for d in "${!DOMAIN_TOKENS[@]}"; do n=$(( 2 * ${DOMAIN_TOKENS[$d]} )); b=$(( n < CAP ? n : CAP )); BUDGET[$d]=$b; total=$((total + b)); done
echo "start $(date +%T); specialists' tokens ${total}, the same for the continued generalist"
CUDA_VISIBLE_DEVICES=0,1 $SLM train $COMMON --nproc 2 --batch 64 --tokens $total $MIX --out $S/runs/generalist-ft \
  --max-minutes $(minutes_left) > $S/generalist-ft.log 2>&1 &
specialist() {
  CUDA_VISIBLE_DEVICES=$1 $SLM train $COMMON --batch 32 --domains $2 --tokens ${BUDGET[$2]} --out $S/runs/$2-ft \
    --max-minutes $(minutes_left) > $S/$2-ft.log 2>&1
  echo "$2: exit $? at $(date +%T), budget ${BUDGET[$2]}"
}
( for d in cpp design review debug; do specialist 2 $d; done ) &
( for d in cmake shell algorithm orchestration; do specialist 3 $d; done ) &
wait
echo "trained at $(date +%T)"
mkdir -p $S/q2
names="cpp design cmake shell algorithm review orchestration debug generalist"
for n in $names; do
  ck=$(cat $S/runs/$n-ft/latest 2>/dev/null) || { echo "$n: no checkpoint"; continue; }
  $SLM quantize --recipe $S/specialist-shipped.json --in $S/runs/$n-ft/$ck/model.safetensors --out $S/q2/$n.safetensors \
    --quantize-head --quantize-embedding --json > $S/q2/$n.quant.json 2>&1 || echo "$n: quantize failed"
done
i=0
for n in $names; do
  gpu=$(( i % 4 )); i=$((i + 1))
  ( CUDA_VISIBLE_DEVICES=$gpu $SLM eval --checkpoint $S/runs/$n-ft --data $DATA.d --domains cpp,design,cmake,shell,algorithm,review,orchestration,debug --device cuda --batches 16 --json > $S/q2/$n.eval-fp32.json 2>$S/q2/$n.eval.err
    CUDA_VISIBLE_DEVICES=$gpu $SLM eval --checkpoint $S/q2/$n.safetensors --recipe $S/specialist-shipped.json --data $DATA.d --domains cpp,design,cmake,shell,algorithm,review,orchestration,debug --tokenizer $S/slm-code-8k.model --device cuda --batches 16 --json > $S/q2/$n.eval-nvfp4.json 2>>$S/q2/$n.eval.err ) &
  (( i % 4 == 0 )) && wait
done
wait
echo "evaluated at $(date +%T)"
for n in $names; do tr '\r' '\n' < $S/$n-ft.log | grep -v "^step" > $S/q2/$n.train.log; cp $S/runs/$n-ft/metrics.jsonl $S/q2/$n.metrics.jsonl; cp $S/runs/$n-ft/config.json $S/q2/$n.config.json; done
cd $S/q2 && tar -czf $OUT/ft.tgz *.json *.log *.jsonl *.err && for n in cpp design cmake shell; do cp $n.safetensors $OUT/; done
ls -la $S/q2/*.safetensors
