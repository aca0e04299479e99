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
  # --no-remove: never let a package fleetbench needs take another one away (docker.io conflicts with docker-ce)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove "${missing[@]}" >/dev/null \
    || die "apt-get could not install ${missing[*]} without removing other packages (or failed): install them by hand"
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

build_pip_image() {
  # build_pip_image NAME WHAT DIR [FILE...] : build DIR/Dockerfile (with FILEs of DIR in its context) FROM the
  # local base image as NAME:<hash of the base and the inputs>, then tag it NAME:latest. Cached: a warm run only
  # re-tags. The build machine's CA bundle goes into the context, for pip behind a TLS-intercepting proxy.
  local name=$1 what=$2 dir=$3; shift 3
  local base="${FLEETBENCH_BASE_IMAGE:-fleetbench/base:bookworm}" log="$FB_STATE/${name##*/}-build.log"
  bash "$FB_ROOT/include/images/base/build.sh"
  local base_id inputs_hash tag
  base_id="$(docker image inspect -f '{{.Id}}' "$base")"
  inputs_hash="$( (echo "$base_id"; cd "$dir" && cat Dockerfile "$@") | sha256sum | cut -c1-12)"
  tag="$name:$inputs_hash"
  if docker image inspect "$tag" >/dev/null 2>&1; then
    say "$what image $tag is cached"
  else
    say "building $tag ($what from PyPI: several minutes the first time on this machine)"
    local ctx ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
    [ -r "$ca" ] || die "no CA bundle at $ca (set PIP_CERT)"
    ctx="$(mktemp -d "${TMPDIR:-/tmp}/fleetbench-image.XXXXXX")"
    (cd "$dir" && cp Dockerfile "$@" "$ctx/") && cp "$ca" "$ctx/ca.crt"
    if ! DOCKER_BUILDKIT=0 docker build -q --network host --build-arg "BASE=$base" \
        --label "org.fleetbench.inputs=$inputs_hash" -t "$tag" "$ctx" >/dev/null 2>"$log"; then
      rm -rf "$ctx"; tail -n 30 "$log" >&2; die "building the $what image failed"
    fi
    rm -rf "$ctx"
  fi
  docker tag "$tag" "$name:latest"
  say "$what image ready: $name:latest"
}
