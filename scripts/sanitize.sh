#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer on a fast subset of the tests: the server, the engines, the data
# parsers (shards, packs, the loader), safetensors, the router and the recipes (fuzz/sanitize.cmake lists them).
# Built in build-asan with clang 14: the subset's library sources and test files instrumented
# (-fsanitize=address,undefined -fno-sanitize-recover=undefined: a UB report fails its test), the rest of the library
# linked from the main build (BUILD_DIR, default build), which must be built first (scripts/setup.sh or
# scripts/test.sh; CI has just built it). Arguments go to ctest, e.g. scripts/sanitize.sh -R ServerTest.
#
# Environment: ASAN_BUILD_DIR=build-asan, BUILD_DIR=build (the main build), SLM_MAIN_BUILD_CURRENT=1 to skip bringing
# the main build up to date first (when it is known to be).
set -euo pipefail
cd "$(dirname "$0")/.."

MAIN_BUILD=${BUILD_DIR:-build}
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
log() { printf '[sanitize] %s\n' "$*"; }

bash fuzz/deps.sh
[[ -f $MAIN_BUILD/build.ninja ]] ||
  { echo "sanitize: $MAIN_BUILD is not configured: run scripts/setup.sh (or scripts/test.sh) first" >&2; exit 1; }
# A no-op when the main build is current (CI: scripts/test.sh just built it). The tests that run the program use it.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}
[[ ${SLM_MAIN_BUILD_CURRENT:-0} == 1 ]] || cmake --build "$MAIN_BUILD" --target slm_core slm

torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null) ||
  { echo "sanitize: torch is not installed (run scripts/setup.sh)" >&2; exit 1; }
main_abs=$(realpath "$MAIN_BUILD")
want="prefix=$torch_prefix compiler=clang++-14 main=$main_abs"
if [[ ! -f $ASAN_BUILD_DIR/build.ninja || "$(cat "$ASAN_BUILD_DIR/.slm-configure" 2>/dev/null)" != "$want" ]]; then
  log "configuring $ASAN_BUILD_DIR"
  cmake -S fuzz -B "$ASAN_BUILD_DIR" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DSLM_FUZZ_TARGETS=OFF -DSLM_SANITIZE_TESTS=ON -DSLM_MAIN_BUILD="$main_abs" >/dev/null
  echo "$want" >"$ASAN_BUILD_DIR/.slm-configure"
fi
log "building the sanitized tests"
# The parser objects are the fuzz targets' (scripts/fuzz.sh): with the build directory left out of ccache's hash,
# whichever script runs second takes them from the cache.
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
cmake --build "$ASAN_BUILD_DIR" --target slm_asan_tests

# halt_on_error/abort: the first report ends the test, which ctest then shows failed with the report. detect_leaks:
# LeakSanitizer at each test process's exit. fuzz/asan.supp holds the reports suppressed, each with its reason.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$PWD/fuzz/ubsan.supp}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}
# As scripts/test.sh: one intra-op thread per test process.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
log "running $(ctest --test-dir "$ASAN_BUILD_DIR" -N "$@" | sed -n 's/^Total Tests: //p') tests"
ctest --test-dir "$ASAN_BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
