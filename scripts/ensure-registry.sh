#!/usr/bin/env bash
# Make sure an image registry answers on 127.0.0.1:5000 (Debian's docker-registry, no auth).
source "$(dirname "$0")/lib.sh"

REGISTRY="${FLEETBENCH_REGISTRY:-127.0.0.1:5000}"
registry_ok() { curl -fsS -m 2 "http://$REGISTRY/v2/" >/dev/null 2>&1; }

registry_ok && exit 0
apt_install docker-registry curl
if ! pgrep -f "docker-registry serve $FB_ROOT/scripts/registry/config.yml" >/dev/null; then
  say "starting docker-registry on $REGISTRY (log: $FB_STATE/registry.log)"
  mkdir -p /var/lib/docker-registry
  nohup docker-registry serve "$FB_ROOT/scripts/registry/config.yml" >"$FB_STATE/registry.log" 2>&1 &
fi
wait_for 30 registry registry_ok || die "registry did not answer on $REGISTRY within 30 s; see $FB_STATE/registry.log"
say "registry answers on $REGISTRY"
