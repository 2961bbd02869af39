#!/usr/bin/env bash
# Issue 44's FIM-trained cpp specialist (docs/results.md, "Code completion"), step by step: the corpus here, the
# training and the evaluation on the GPU machine (bash scripts/device-deps.sh first; carry .deps and the pack).
#   bash scripts/fim-specialist.sh data      # here: fetch, corpus, held-out files, shards, pack (about 12 min)
#   bash scripts/fim-specialist.sh train     # GPU machine: 230M tokens from the generalist (7.2 min on one H200)
#   bash scripts/fim-specialist.sh eval      # GPU machine: slm eval fim of it, the shipped models and the baselines
#   bash scripts/fim-specialist.sh context   # GPU machine: issue 45's context modes with an editor's window
set -euo pipefail
cd "$(dirname "$0")/.."
W=${W:-out/fim}
SLM=${SLM:-build/slm}
# A manifest of the FIM model next to the shipped cpp specialist and generalist.
manifest() {
  mkdir -p $W/models/cpp-fim && cp $W/cpp-fim.safetensors $W/models/cpp-fim/model.safetensors
  python3 - "$W" <<'PY'
import hashlib, json, os, sys
w = sys.argv[1]
models = {"cpp-fim": f"{w}/models/cpp-fim/model.safetensors", "cpp": "models/cpp/model.safetensors",
          "generalist": "models/generalist/model.safetensors"}
base = f"{w}/models"
spec = [{"name": n, "domain": n, "recipe": os.path.relpath("recipes/specialist-shipped.json", base),
         "checkpoint": os.path.relpath(p, base), "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest(),
         "tokenizer": os.path.relpath("tokenizer/slm-code-8k.model", base), "routes": [r]}
        for (n, p), r in zip(models.items(), ("cpp", "algorithm", "review"))]
json.dump({"name": "fim-eval", "description": "issue 44's FIM evaluation", "specialists": spec},
          open(f"{base}/ensemble.json", "w"), indent=1)
PY
}
case ${1:-} in
data)
  $SLM data fetch --cache $W/debian --packages recipes/data/fim-packages.txt --rate-mb 0
  $SLM data build --domain cpp --source-dir $W/debian/src --out $W/corpus-all --tokenizer tokenizer/slm-code-8k.model
  # Boost's installed headers (a third of the text, mostly preprocessor metaprogramming) left out; 7 of 10 train files
  # kept, so that the pack fits a device call's 64 MiB with the model; the evaluation files: the test split's
  # packages that have no file in train (capnproto, apriltag).
  python3 - "$W" <<'PY'
import hashlib, json, os, sys
w = sys.argv[1]
train = {json.loads(l)["package"] for l in open(f"{w}/corpus-all/cpp/train.jsonl")}
for out in (f"{w}/corpus/cpp", f"{w}/eval/cpp"):
    os.makedirs(out, exist_ok=True)
held = open(f"{w}/eval/cpp/test.jsonl", "w")
for split in ("train", "validation", "test"):
    with open(f"{w}/corpus/cpp/{split}.jsonl", "w") as f:
        for line in open(f"{w}/corpus-all/cpp/{split}.jsonl"):
            d = json.loads(line)
            if d["package"] == "libboost1.74-dev":
                continue
            if split == "train" and int(hashlib.sha1(d["path"].encode()).hexdigest(), 16) % 10 >= 7:
                continue
            f.write(line)
            if split == "test" and d["package"] not in train:
                held.write(line)
PY
  $SLM data shard --input $W/corpus --tokenizer tokenizer/slm-code-8k.model --out $W/shards
  $SLM data pack --input $W/shards --out $W/packs
  ;;
train)
  $SLM train --recipe recipes/specialist-shipped.json --data $W/packs/pack-00000.slmpack \
    --init models/generalist/model.safetensors --device cuda --seq-len 1024 --batch 32 --domains cpp --tokens ${FIM_TOKENS:-230000000} \
    --tokenizer tokenizer/slm-code-8k.model --warmup 5 --decay-fraction 0.9 --eval-every 1000 --eval-batches 16 \
    --checkpoint-every 0 --keep-last 1 --log-every 50 --optim matrix_lr=0.005 --optim embed_lr=0.075 \
    --optim head_lr=0.002 --optim router_lr=0.00125 --optim norm_lr=0.00125 --optim vector_lr=0.00125 \
    --optim scalar_lr=0.00125 --optim muon_momentum_start=0.95 --out $W/runs/cpp-fim
  ck=$(cat $W/runs/cpp-fim/latest)
  $SLM quantize --recipe recipes/specialist-shipped.json --in $W/runs/cpp-fim/$ck/model.safetensors \
    --out $W/cpp-fim.safetensors --quantize-head --quantize-embedding
  ;;
eval)
  manifest
  HELD=$(ls -d $W/debian/src/capnproto_*/c++/src)
  $SLM eval fim --corpus $W/eval --ensemble $W/models/ensemble.json --specialist cpp-fim,cpp,generalist --cases 300 \
    --body-cases 40 --context none --device cuda --jobs 16 -I "$HELD" --out $W/eval-quality
  $SLM eval fim --corpus $W/eval --ensemble $W/models/ensemble.json --specialist cpp-fim,cpp --no-random --cases 200 \
    --body-cases 0 --context none,neighbours,graph --device cuda --out $W/eval-context
  # Latency as an editor sees it: the model served, llama.vim's request (cold, then typing on).
  $SLM serve --recipe recipes/specialist-shipped.json --checkpoint $W/cpp-fim.safetensors \
    --tokenizer tokenizer/slm-code-8k.model --device ${DEVICE:-cuda} --port 8011 &
  server=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; sleep 0.5; done
  $SLM eval fim --corpus $W/eval --no-random --cases 200 --body-cases 0 --context none \
    --server http://127.0.0.1:8011 --latency-files 40 --out $W/eval-latency
  kill $server
  ;;
context)
  # Issue 45: no extra context, llama.vim's neighbour chunks and the context graph at the cursor, each prompt cut to
  # the window an editor sends (1,500 characters of whole lines before the cursor, 16 lines after it), so that the
  # 1,024-token context leaves the chunks room.
  manifest
  $SLM eval fim --corpus $W/eval --ensemble $W/models/ensemble.json --specialist cpp-fim,cpp --no-random --cases 400 \
    --body-cases 0 --context none,neighbours,graph --window-prefix-chars 1500 --window-suffix-lines 16 \
    --device ${DEVICE:-cuda} --out $W/eval-graph
  ;;
*) sed -n 2,7p "$0"; exit 2 ;;
esac
