# Shared helpers for the service scripts (sourced, not executed).
# Every script is idempotent: it checks first and only starts or installs what is missing.
set -euo pipefail

FB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FB_STATE="${FB_STATE:-$FB_ROOT/.data/services}"
mkdir -p "$FB_STATE"

say() { printf '[fleetbench] %s\n' "$*" >&2; }
die() { printf '[fleetbench] error: %s\n' "$*" >&2; exit 1; }

is_debian_root() {
  [ "$(id -u)" = 0 ] && [ -r /etc/os-release ] && grep -Eqi '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release
}

APT_UPDATED="$FB_STATE/.apt-updated"
apt_install() {
  # apt_install PKG... : install Debian packages that are not installed yet.
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  is_debian_root || die "missing packages: ${missing[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${missing[*]}) and rerun."
  say "installing Debian packages: ${missing[*]}"
  if [ ! -e "$APT_UPDATED" ] || [ -n "$(find "$APT_UPDATED" -mmin +360 2>/dev/null)" ]; then
    apt-get update -qq && touch "$APT_UPDATED"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

wait_for() {
  # wait_for SECONDS DESCRIPTION COMMAND... : poll until COMMAND succeeds.
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -ge $end ] && return 1
    sleep 0.5
  done
}
