#!/usr/bin/env bash
# Installs the Debian packages whose files the corpora are built from (`slm data build`; see
# ../shared/reference/local_data.md for what each provides and its size). The test suite does not need them.
#
#   scripts/data-deps.sh              install the header/script/documentation packages and the tools the debug
#                                     and review generators run (about 1 GB installed)
#   scripts/data-deps.sh --sources    also fetch and unpack Debian source packages into out/data-src
#                                     (for `slm data build --source-dir out/data-src`); adds a deb-src entry
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/debian.sh

# Binary packages read in place (their package name and copyright file become each document's metadata).
PACKAGES=(
  libstdc++-12-dev llvm-14-dev libclang-14-dev libboost1.74-dev libeigen3-dev libasio-dev libabsl-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  cmake-data bash-completion git
  # design / algorithm: man pages (rendered by groff), reference HTML (cppreference, Boost, LLVM manuals)
  man-db manpages manpages-dev groff-base gzip cppreference-doc-en-html libboost1.74-doc llvm-14-doc
  # debug: compilers, sanitizer runtimes (with g++/clang), gdb, valgrind; review: clang-tidy, cppcheck
  g++ clang gdb valgrind clang-tidy cppcheck diffutils
)
# Source packages (apt-get source) with idiomatic C++, CMake projects and shell test suites.
SOURCES=(leveldb ninja-build fmtlib spdlog googletest benchmark nlohmann-json3 cmake git)

log() { printf '[data-deps] %s\n' "$*"; }
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo

mapfile -t missing < <(deb_missing "${PACKAGES[@]}")
if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  deb_install "${missing[@]}"
else
  log "corpus packages present"
fi

if [[ ${1:-} == --sources ]]; then
  src_list=/etc/apt/sources.list.d/slm-src.sources
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    # The same mirror as the existing binary entry.
    uri=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/*.sources | head -1 | awk '{print $2}')
    uri=${uri:-http://deb.debian.org/debian}
    log "adding a deb-src entry ($uri) in $src_list"
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$uri" | $SUDO tee "$src_list" >/dev/null
    $SUDO apt-get update -qq
  fi
  mkdir -p out/data-src
  for s in "${SOURCES[@]}"; do
    if compgen -G "out/data-src/${s}-*/debian/control" >/dev/null; then continue; fi
    # One package per call: a single 404 aborts a multi-package apt-get source.
    for try in 1 2 3; do
      if (cd out/data-src && apt-get source -qq "$s" >/dev/null 2>&1); then break; fi
      [[ $try == 3 ]] && log "skipping $s (apt-get source failed)"
      sleep 2
    done
  done
  rm -f out/data-src/*.dsc out/data-src/*.tar.* 2>/dev/null || true
  log "sources in out/data-src: $(ls out/data-src | tr '\n' ' ')"
fi
