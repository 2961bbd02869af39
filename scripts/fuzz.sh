#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, Debian's clang 14) of every parser that takes outside input: the HTTP request
# JSON, safetensors files, recipes, ensemble manifests, router files, token shards and packs (fuzz/README.md).
# Builds the targets in build-fuzz (only the parser sources, with AddressSanitizer and UndefinedBehaviorSanitizer)
# and runs each for SECONDS (default 60) from its committed seeds, fuzz/corpus/<target>. Exits non-zero on any
# crash, leak, UB report, timeout or out-of-memory; the input that caused it is in build-fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 600 recipe pack
#
# Environment: BUILD_DIR=build-fuzz, FUZZ_JOBS (targets fuzzed at once; default: the number of cores), and
# FUZZ_ARGS (more libFuzzer options). New inputs libFuzzer finds go to build-fuzz/corpus/<target>, which the next run
# starts from too; fuzz/corpus/ is never written.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-60}
shift || true
ALL_TARGETS=(openai_request safetensors recipe manifest router shard pack)
[[ $# -gt 0 ]] && TARGETS=("$@") || TARGETS=("${ALL_TARGETS[@]}")
BUILD_DIR=${BUILD_DIR:-build-fuzz}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}

log() { printf '[fuzz] %s\n' "$*"; }

# clang 14 with libFuzzer and the sanitizer runtimes (libclang-rt-14-dev), lld for linking against libtorch.
bash fuzz/deps.sh

torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null) ||
  { echo "fuzz: torch is not installed (run scripts/setup.sh)" >&2; exit 1; }
want="prefix=$torch_prefix compiler=clang++-14"
if [[ ! -f $BUILD_DIR/build.ninja || "$(cat "$BUILD_DIR/.slm-configure" 2>/dev/null)" != "$want" ]]; then
  log "configuring $BUILD_DIR"
  cmake -S fuzz -B "$BUILD_DIR" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DSLM_FUZZ_TARGETS=ON >/dev/null
  echo "$want" >"$BUILD_DIR/.slm-configure"
fi
log "building the fuzz targets"
# The same objects serve build-asan (scripts/sanitize.sh) through ccache when the build directory is not hashed.
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
cmake --build "$BUILD_DIR" --target fuzz_all

# detect_leaks: libFuzzer reports a leak as a failure. The UBSan options make a report abort with its stack (the
# objects are built with -fno-sanitize-recover=undefined as well).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_target() {
  local t=$1 work=$BUILD_DIR/corpus/$1 art=$BUILD_DIR/artifacts/$1/
  mkdir -p "$work" "$art"
  # -timeout: one input running this long is a hang; -rss_limit_mb: an input that makes a parser allocate past it
  # (a size field trusted before it is checked) is an out-of-memory failure.
  "$BUILD_DIR/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=20 -rss_limit_mb=2048 -max_len=8192 \
    -dict=fuzz/fuzz.dict -artifact_prefix="$art" -print_final_stats=1 ${FUZZ_ARGS:-} \
    "$work" "fuzz/corpus/$t" >"$BUILD_DIR/fuzz-$t.log" 2>&1
}

log "fuzzing ${TARGETS[*]} for ${SECONDS_PER_TARGET} s each, $FUZZ_JOBS at a time"
failed=()
pids=() names=()
wait_one() {
  local pid=${pids[0]} name=${names[0]}
  pids=("${pids[@]:1}") names=("${names[@]:1}")
  if wait "$pid"; then
    log "$name: clean ($(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$BUILD_DIR/fuzz-$name.log" |
      grep -Eo '[0-9]+$' || echo '?') inputs, $(grep -Eo 'cov: [0-9]+' "$BUILD_DIR/fuzz-$name.log" | tail -1))"
  else
    failed+=("$name")
    log "$name: FAILED; the last lines of $BUILD_DIR/fuzz-$name.log:"
    tail -n 60 "$BUILD_DIR/fuzz-$name.log" | sed 's/^/    /'
  fi
}
for t in "${TARGETS[@]}"; do
  [[ -x $BUILD_DIR/fuzz_$t ]] || { echo "fuzz: no target '$t' (targets: ${ALL_TARGETS[*]})" >&2; exit 2; }
  ((${#pids[@]} >= FUZZ_JOBS)) && wait_one
  run_target "$t" &
  pids+=($!) names+=("$t")
done
while ((${#pids[@]})); do wait_one; done

if ((${#failed[@]})); then
  echo "fuzz: ${failed[*]} failed; reproduce with $BUILD_DIR/fuzz_<target> $BUILD_DIR/artifacts/<target>/<file>" >&2
  exit 1
fi
log "all clean"
