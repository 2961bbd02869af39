#!/usr/bin/env bash
# Runs setup if needed (it is idempotent and quick on a set-up machine), then the whole test suite.
# Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# The first command builds only the program; the suite needs its tests too (slm_tests depends on slm).
SLM_TARGET=slm_tests bash scripts/setup.sh
# The test-only Python clients (.venv-test/) and headless Chromium that the server tests drive `slm serve` with.
bash scripts/test-deps.sh
# ctest runs one process per core; more than one intra-op thread per process oversubscribes the CPU and makes
# small-tensor tests many times slower. A caller may still raise it.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
