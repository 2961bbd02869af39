#!/usr/bin/env bash
# One-command setup: Debian packages, the pinned libtorch (from PyPI's torch wheel), configure, build.
# Idempotent: a second run on a set-up machine installs nothing and only rebuilds what changed.
#
# Environment:
#   BUILD_DIR=build        where CMake builds (the program lands in $BUILD_DIR/slm)
#   SLM_CUDA=ON            also build the CUDA (sm_90) sources
#   SLM_DEPS_PREFIX=DIR    use Debian packages unpacked under DIR (GPU machine: scripts/device-deps.sh) instead of apt
#   CMAKE_BUILD_TYPE=...   Release by default
#   SLM_TARGET=slm         the targets to build (space-separated): the program by default (what the README's first
#                          command runs); scripts/test.sh asks for slm_tests, scripts/cuda-compile-check.sh for object
#                          files; SLM_TARGET= (empty) builds every default target
#   SLM_WERROR=ON          compiler warnings are errors (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/debian.sh

BUILD_DIR=${BUILD_DIR:-build}
SLM_CUDA=${SLM_CUDA:-OFF}
SLM_WERROR=${SLM_WERROR:-OFF}
SLM_TARGET=${SLM_TARGET-slm}
TORCH_VERSION=2.11.0
# Build tools, the test framework, CLI and JSON libraries. Keep in sync with the README's dependency table.
DEB_PACKAGES=(cmake ninja-build g++ ccache python3 python3-pip libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libsentencepiece-dev libtree-sitter-dev libgloo-dev libcpp-httplib-dev liblzma-dev gnuplot-nox
  clang-tidy cppcheck groff-base)  # the review/design corpus tests run clang-tidy, cppcheck and groff

log() { printf '[setup] %s\n' "$*"; }
have_python_pip() { command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; }

if [[ -z "${SLM_DEPS_PREFIX:-}" ]]; then
  missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    # python3/pip may come from elsewhere (pyenv); only ask apt for them when absent.
    if [[ $p == python3 ]] && command -v python3 >/dev/null; then continue; fi
    if [[ $p == python3-pip ]] && have_python_pip; then continue; fi
    [[ -n $(deb_missing "$p") ]] && missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    deb_install "${missing[@]}"
  else
    log "Debian packages present"
  fi
fi

torch_version() { python3 -c 'import torch,sys;sys.stdout.write(torch.__version__)' 2>/dev/null || true; }
tv=$(torch_version)
if [[ $tv != "$TORCH_VERSION"* ]]; then
  log "installing torch==$TORCH_VERSION from PyPI (found: '${tv:-none}')"
  python3 -m pip install --quiet "torch==$TORCH_VERSION" || python3 -m pip install --quiet --break-system-packages "torch==$TORCH_VERSION"
  tv=$(torch_version)
  [[ $tv == "$TORCH_VERSION"* ]] || { echo "setup: torch $TORCH_VERSION did not install (found '$tv')" >&2; exit 1; }
else
  log "torch $tv present"
fi
# The tree-sitter C++ grammar for `slm data graphs`: generated parser.c/scanner.c from PyPI source
# distributions, unpacked into .deps (docs/context-graphs.md); a no-op when already there.
bash scripts/tree-sitter-cpp.sh

TORCH_PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)

prefix_path="$TORCH_PREFIX"
[[ -n "${SLM_DEPS_PREFIX:-}" ]] && prefix_path="$TORCH_PREFIX;$(realpath "$SLM_DEPS_PREFIX")/usr"
# An image with its own nlohmann-json (the GPU image has 3.11.3, the unpacked package 3.11.2) keeps its own: with both,
# the library (which sees the prefix's headers) and the program (the image's) compile against two json ABIs and fail
# to link. The unpacked copy is only a fallback, so it goes.
if [[ -n "${SLM_DEPS_PREFIX:-}" ]] &&
  compgen -G "/usr/share/cmake*/nlohmann_json/nlohmann_jsonConfig.cmake" >/dev/null; then
  rm -rf "$SLM_DEPS_PREFIX/usr/include/nlohmann" "$SLM_DEPS_PREFIX/usr/share/cmake/nlohmann_json" \
    "$SLM_DEPS_PREFIX/usr/share/pkgconfig/nlohmann_json.pc"
fi

# Reconfigure only when the build directory is new or the options changed.
stamp="$BUILD_DIR/.slm-configure"
want="cuda=$SLM_CUDA werror=$SLM_WERROR prefix=$prefix_path type=${CMAKE_BUILD_TYPE:-Release}"
if [[ ! -f $BUILD_DIR/build.ninja || ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
  log "configuring $BUILD_DIR ($want)"
  cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" \
    -DCMAKE_PREFIX_PATH="$prefix_path" \
    -DSLM_CUDA="$SLM_CUDA" \
    -DSLM_WERROR="$SLM_WERROR"
  echo "$want" > "$stamp"
fi
# The library and the tests compile with a precompiled <torch/torch.h>; ccache caches such objects only when told
# that the PCH's defines and __TIME__ may be ignored (its manual, "Precompiled headers"). A caller's setting wins.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}
log "building${SLM_TARGET:+ $SLM_TARGET}"
# shellcheck disable=SC2086  # the targets split at spaces
cmake --build "$BUILD_DIR" ${SLM_TARGET:+--target $SLM_TARGET}
log "done: $BUILD_DIR/slm"
