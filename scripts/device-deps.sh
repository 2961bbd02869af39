#!/usr/bin/env bash
# Prepares the Debian development packages for a machine that cannot reach Debian's archive (the GPU
# machine): downloads them here and unpacks them under .deps/root (git-ignored). Carry .deps to that
# machine and run:  SLM_DEPS_PREFIX=.deps/root SLM_CUDA=ON bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libsentencepiece-dev libsentencepiece0
  libtree-sitter-dev libtree-sitter0 libgloo-dev liblzma-dev
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev zlib1g-dev libbrotli-dev libbrotli1)  # slm serve (+ the headers httplib.h includes)
mkdir -p .deps/debs .deps/root
missing=()
for p in "${PACKAGES[@]}"; do ls .deps/debs/"${p}"_*.deb >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -qq
  (cd .deps/debs && apt-get download "${missing[@]}")
fi
for f in .deps/debs/*.deb; do dpkg-deb -x "$f" .deps/root; done
bash scripts/tree-sitter-cpp.sh  # the C++ grammar for slm data graphs, also under .deps
echo "unpacked ${#PACKAGES[@]} packages into .deps/root ($(du -sh .deps | cut -f1))"
