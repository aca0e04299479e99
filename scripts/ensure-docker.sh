#!/usr/bin/env bash
# Make sure a Docker engine answers. On Debian/Ubuntu as root, install Debian's docker.io
# and start dockerd without a bridge network (containers use network_mode none or host).
source "$(dirname "$0")/lib.sh"

docker_ok() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if docker_ok; then
  exit 0
fi
if ! is_debian_root; then
  die "no Docker engine answers at ${DOCKER_HOST:-unix:///var/run/docker.sock}. Install Docker Engine (Debian/Ubuntu: apt-get install docker.io), start it, and rerun."
fi
if [ -n "${DOCKER_HOST:-}" ] && [ "$DOCKER_HOST" != "unix:///var/run/docker.sock" ]; then
  die "no Docker engine answers at DOCKER_HOST=$DOCKER_HOST: start it there, or unset DOCKER_HOST for this machine's engine"
fi
# Another engine's packages (Docker CE, Moby) conflict with docker.io: installing it would remove them. Say so instead.
for other in docker-ce moby-engine; do
  if dpkg-query -W -f='${Status}' "$other" 2>/dev/null | grep -q 'install ok installed'; then
    die "Docker engine package $other is installed but its engine does not answer at unix:///var/run/docker.sock: start it (systemctl start docker) and rerun; fleetbench does not replace it with docker.io"
  fi
done
apt_install docker.io
command -v docker >/dev/null || die "docker client not found after installing docker.io"
# The default engine is starting already when its pid file names a running dockerd (not any process called dockerd:
# a test's private engine on its own socket, or a zombie, is not this machine's engine).
default_dockerd_running() {
  local pid
  pid="$(cat /var/run/docker.pid 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]
}
if ! default_dockerd_running; then
  say "starting dockerd (no bridge; log: $FB_STATE/dockerd.log)"
  nohup dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
    >"$FB_STATE/dockerd.log" 2>&1 &
fi
wait_for 60 dockerd docker_ok || die "dockerd did not answer within 60 s; see $FB_STATE/dockerd.log"
say "Docker engine $(docker version --format '{{.Server.Version}}') is up"
