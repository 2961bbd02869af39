#!/usr/bin/env bash
# The Debian packages scripts/fuzz.sh and scripts/sanitize.sh need beyond scripts/setup.sh's: clang 14 with
# libFuzzer and the sanitizer runtimes, and lld (links against the 1 GB libtorch in a fraction of ld's time).
# Installs only what is missing, as setup.sh does.
set -euo pipefail
packages=(clang-14 libclang-rt-14-dev lld-14)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[deps] installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
