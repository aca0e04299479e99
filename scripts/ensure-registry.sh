#!/usr/bin/env bash
# Make sure an image registry answers on 127.0.0.1:5000 (Debian's docker-registry, no auth).
source "$(dirname "$0")/lib.sh"

REGISTRY="${FLEETBENCH_REGISTRY:-127.0.0.1:5000}"
registry_ok() { curl -fsS -m 2 "http://$REGISTRY/v2/" >/dev/null 2>&1; }

registry_ok && exit 0
# Debian's package starts its own service (its config: every interface, :5000, htpasswd auth) where systemd runs:
# keep it from starting while installing, and stop it if it runs, so this script's registry can take 127.0.0.1:5000.
own_policy=""
if [ ! -e /usr/sbin/policy-rc.d ] && is_debian_root; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
fi
trap 'if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
apt_install docker-registry curl
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1 \
    && systemctl is-active --quiet docker-registry 2>/dev/null; then
  say "stopping the docker-registry package's own service (its config listens on :5000 with auth; ours on $REGISTRY)"
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
if ! pgrep -f "docker-registry serve $FB_ROOT/scripts/registry/config.yml" >/dev/null; then
  say "starting docker-registry on $REGISTRY (log: $FB_STATE/registry.log)"
  mkdir -p /var/lib/docker-registry
  nohup docker-registry serve "$FB_ROOT/scripts/registry/config.yml" >"$FB_STATE/registry.log" 2>&1 &
fi
wait_for 30 registry registry_ok || die "registry did not answer on $REGISTRY within 30 s; see $FB_STATE/registry.log"
say "registry answers on $REGISTRY"
