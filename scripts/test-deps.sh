#!/usr/bin/env bash
# Test-only dependencies, which the program itself never needs: the Python clients the server tests drive `slm serve`
# with (openai, ollama, selenium, jsonschema; pinned in scripts/test-requirements.txt), in a virtual environment at
# .venv-test/ that the tests run (tests/CMakeLists.txt: SLM_TEST_PYTHON), Debian's chromium and chromium-driver for
# the chat page test in a headless browser, and the Debian tools the source-fetch tests run. scripts/test.sh runs it
# before the tests.
# Idempotent: on a machine that has it all it installs nothing and takes a fraction of a second.
#
# Environment:
#   SLM_TEST_VENV=.venv-test   where the virtual environment goes (the tests look for it there unless SLM_TEST_PYTHON
#                              names another python at run time)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/debian.sh

VENV=${SLM_TEST_VENV:-.venv-test}
REQUIREMENTS=scripts/test-requirements.txt
PY_MODULES=(openai ollama selenium jsonschema)
# dpkg-dev and xz-utils: the source-fetch tests build a local Debian archive (dpkg-source, dpkg-scansources, xz); most
# images have them, a minimal one does not, and there those tests would skip.
DEB_PACKAGES=(chromium chromium-driver dpkg-dev xz-utils)

log() { printf '[test-deps] %s\n' "$*"; }

missing_debs() {
  local out
  mapfile -t out < <(deb_missing "${DEB_PACKAGES[@]}")
  # Debian's python3 makes virtual environments only with python3-venv (ensurepip); another python3 (pyenv) has it.
  python3 -c 'import ensurepip, venv' 2>/dev/null || out+=(python3-venv)
  if ((${#out[@]})); then printf '%s\n' "${out[@]}"; fi
}
# The stamp records which requirements and which python the environment was made from.
want_stamp() {
  local req py
  req=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
  py=$(python3 -c 'import sys; print(sys.version.splitlines()[0])')
  printf '%s %s\n' "$req" "$py"
}
venv_ok() {
  [[ -x $VENV/bin/python && -f $VENV/.slm-stamp && "$(cat "$VENV/.slm-stamp")" == "$(want_stamp)" ]] &&
    "$VENV/bin/python" -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' "${PY_MODULES[@]}" 2>/dev/null
}

if [[ -z "$(missing_debs)" ]] && venv_ok; then
  log "present: ${DEB_PACKAGES[*]}, $VENV (${PY_MODULES[*]})"
  exit 0
fi

# Two test runs at once (two clones, or parallel ctest wrappers) must not install into one environment together.
exec 9>"${TMPDIR:-/tmp}/slm-test-deps.lock"
flock 9

mapfile -t missing < <(missing_debs)
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  deb_install "${missing[@]}"
fi

if ! venv_ok; then
  log "creating $VENV from $REQUIREMENTS"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$REQUIREMENTS"
  want_stamp > "$VENV/.slm-stamp"
  venv_ok || { echo "test-deps: $VENV does not import ${PY_MODULES[*]} after installing them" >&2; exit 1; }
fi
versions=$("$VENV/bin/python" -c 'import importlib.metadata as m, sys
print(", ".join(f"{p} {m.version(p)}" for p in sys.argv[1:]))' "${PY_MODULES[@]}")
log "done: $VENV/bin/python ($versions), $(chromium --version 2>/dev/null || echo 'no chromium')"
