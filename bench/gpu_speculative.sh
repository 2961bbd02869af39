#!/usr/bin/env bash
# MTP speculative decoding on one GPU (issue 16): the shipped cpp specialist, batch 1, `slm generate --device cuda`
# plain against `--speculative 1` (the checkpoint has one MTP module), greedy and sampled, on prompts from a package
# held out of training (capnproto's kj: each prompt is the 1,500 bytes before the middle line of a file, as
# bench/speculative_bench does on the CPU). Runs alternate plain / speculative; each prints its decode tokens/s and,
# speculating, the drafts accepted.
#   SLM=.devbin/slm KJ=/path/to/capnproto/src/kj [CKPT=models/cpp/model.safetensors] bash bench/gpu_speculative.sh
set -uo pipefail
SLM=${SLM:-build-cuda/slm}
KJ=${KJ:?the directory of the kj sources of capnproto}
MAX=${MAX:-256}
for f in async encoding exception mutex; do
  P=$(python3 -c "
import sys
t = open('$KJ/$f.c++', errors='replace').read()
mid = t.rfind('\n', 0, len(t) // 2) + 1
print(t[max(0, mid - 1500):mid], end='')")
  for mode in "--temperature 0" "--temperature 0.8 --top-k 40"; do
    for spec in 0 1 0 1; do
      line=$($SLM generate --device cuda --recipe recipes/specialist-shipped.json --checkpoint ${CKPT:-models/cpp/model.safetensors} \
        --tokenizer tokenizer/slm-code-8k.model --prompt "$P" --max-tokens $MAX $mode --seed 1 --speculative $spec 2>&1 |
        grep -E "^slm: cuda: prefill")
      echo "$f | $mode | speculative $spec | ${line#slm: cuda: }"
    done
  done
done
