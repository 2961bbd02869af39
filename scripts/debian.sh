# Sourced by the scripts that install Debian packages (setup.sh, test-deps.sh, data-deps.sh, fuzz/deps.sh): one
# definition of "installed" and of how a missing package is installed.

# Prints each of the named packages that is not installed, one per line.
deb_missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

# Installs the named packages (none: nothing), through sudo when not root.
deb_install() {
  (($#)) || return 0
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}
