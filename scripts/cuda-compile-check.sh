#!/usr/bin/env bash
# CI's check that the CUDA sources still compile (.ci/run): the CUDA configuration (SLM_CUDA=ON) in build-cuda and,
# of its objects, those that differ from the CPU build's: the .cu kernels and the library and program sources that
# test SLM_WITH_CUDA, the definition only that configuration sets. The other ~140 objects are compiled from the same
# text as the CPU build's, which CI has just built and tested, and compiling them a second time cost CI ~15 of its
# 90 minutes (README, "CI"). The CUDA link is the GPU machine's (its build links everything before its tests run).
#
# Environment: BUILD_DIR=build-cuda; the rest as scripts/setup.sh (SLM_DEPS_PREFIX, CMAKE_BUILD_TYPE, SLM_WERROR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}

# The rule holds only while no header tests the definition: a header that did would change every includer.
if headers=$(grep -rlE 'SLM_WITH_CUDA' src apps --include='*.h' --include='*.hpp' --include='*.cuh'); then
  echo "cuda-compile-check: these headers test SLM_WITH_CUDA, so their includers differ in the CUDA build too:" >&2
  echo "$headers" >&2
  echo "cuda-compile-check: keep the test in .cpp files (or make this script compile the includers)" >&2
  exit 1
fi
# Object targets as CMake's Ninja generator names them: <dir>/CMakeFiles/<target>.dir/<source below dir>.o.
objects=()
while IFS= read -r f; do objects+=("src/CMakeFiles/slm_core.dir/${f#src/}.o"); done < <(
  { find src -name '*.cu'; grep -rlE 'SLM_WITH_CUDA' src --include='*.cpp'; } | sort)
while IFS= read -r f; do objects+=("apps/slm/CMakeFiles/slm.dir/${f#apps/slm/}.o"); done < <(
  grep -rlE 'SLM_WITH_CUDA' apps/slm --include='*.cpp' | sort)
echo "cuda-compile-check: ${#objects[@]} objects differ from the CPU build's; compiling them in $BUILD_DIR"
SLM_CUDA=ON BUILD_DIR=$BUILD_DIR SLM_TARGET="${objects[*]}" bash scripts/setup.sh
