#!/usr/bin/env bash
# Runs setup if needed (it is idempotent and quick on a set-up machine), then the whole test suite.
# Exits non-zero when any test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/setup.sh
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
