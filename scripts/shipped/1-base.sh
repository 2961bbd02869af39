#!/usr/bin/env bash
# Issue 20, call 1: the shared base of the shipped specialists, data-parallel on every GPU of the machine.
set -uo pipefail
S=/tmp/ship
mkdir -p $S
tar -xJf .devrun/devbin.tar.xz -C $S
source $S/.devbin/env.sh
SLM=$S/.devbin/slm
cp out/ship-pack/ship-00000.slmpack tokenizer/slm-code-8k.model recipes/specialist-shipped.json $S/
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
NGPU=$(nvidia-smi -L | wc -l)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MIX="--mix cpp=4 --mix design=2 --mix cmake=1.5 --mix shell=1 --mix algorithm=0.5 --mix review=0.15 --mix orchestration=0.1 --mix debug=0.05"
echo "start $(date +%T), $NGPU GPUs"
$SLM train --recipe $S/specialist-shipped.json --data $S/ship-00000.slmpack --out $S/runs/base --device cuda \
  --nproc $NGPU --batch $((32 * NGPU)) --seq-len 1024 --steps 100000 --warmup 100 --decay-fraction 0 \
  --max-minutes ${MIN:-7.5} $MIX --eval-every 250 --eval-batches 4 --checkpoint-every 500 --keep-last 1 \
  --tokenizer $S/slm-code-8k.model --log-every 10 > $S/base.log 2>&1
echo "exit $? at $(date +%T)"
tr '\r' '\n' < $S/base.log | grep -v "^step" | tail -12
tr '\r' '\n' < $S/base.log | grep "^step" | tail -2
mkdir -p $OUT/base && cp $S/runs/base/metrics.jsonl $S/runs/base/config.json $OUT/base/ && tr '\r' '\n' < $S/base.log | grep -v "^step" > $OUT/base/train.log
ls $S/runs/base
