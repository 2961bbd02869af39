#!/usr/bin/env bash
# The Debian packages scripts/fuzz.sh and scripts/sanitize.sh need beyond scripts/setup.sh's: clang 14 with
# libFuzzer and the sanitizer runtimes, and lld (links against the 1 GB libtorch in a fraction of ld's time).
# Installs only what is missing, as setup.sh does.
set -euo pipefail
packages=(clang-14 libclang-rt-14-dev lld-14)
source "$(dirname "$0")/../scripts/debian.sh"
mapfile -t missing < <(deb_missing "${packages[@]}")
if ((${#missing[@]})); then
  echo "[deps] installing Debian packages: ${missing[*]}"
  deb_install "${missing[@]}"
fi
