#!/usr/bin/env bash
# Bundles CUDA binaries built here (SLM_CUDA=ON, e.g. the CI's build-cuda) for the GPU machine, so that a device call
# runs them without building there: the binaries plus the Debian libraries they load that the GPU image lacks
# (sentencepiece, tree-sitter, cpp-httplib and its TLS/compression libraries). libtorch is not bundled: the GPU
# image's python3 has the same torch 2.11.0+cu130, found through LD_LIBRARY_PATH.
#   bash scripts/device-bundle.sh build-cuda/slm [build-cuda/bench/moe_bench ...]     -> .devbin/ (git-ignored)
# On the GPU machine (carry .devbin):
#   source .devbin/env.sh && .devbin/slm train ...
set -euo pipefail
cd "$(dirname "$0")/.."
(($#)) || { echo "usage: $0 BINARY..." >&2; exit 2; }
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >>.git/info/exclude
rm -rf .devbin && mkdir -p .devbin/lib
for bin in "$@"; do
  cp "$bin" .devbin/
  # Libraries resolved from the system directory, except the C/C++ runtime every image has.
  ldd "$bin" | awk '$3 ~ /^\/(usr\/)?lib\/x86_64-linux-gnu\// {print $3}' |
    grep -Ev '/lib(c|m|stdc\+\+|gcc_s|pthread|dl|rt|util)\.so' | while read -r lib; do
      cp -L "$lib" .devbin/lib/
    done
done
cat >.devbin/env.sh <<'SH'
# Sourced on the GPU machine: the bundled libraries, then the image's libtorch and its CUDA libraries.
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_torch=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
export LD_LIBRARY_PATH="$_here/lib:$_torch/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SH
du -sh .devbin
