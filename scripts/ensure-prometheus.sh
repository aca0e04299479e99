#!/usr/bin/env bash
# Make sure Debian's Prometheus binaries (prometheus, promtool) are installed, for the test that scrapes
# the view's /fleetbench/metrics with a real Prometheus (tests/integration/test_metrics_prometheus.py).
# That test runs its own instance on a free loopback port with a temporary config and data folder, so
# the package's own service is kept from starting (policy-rc.d while installing) and, under systemd,
# disabled: nothing is left listening on :9090.
source "$(dirname "$0")/lib.sh"

command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && exit 0
own_policy=""
if [ ! -e /usr/sbin/policy-rc.d ] && is_debian_root; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
fi
trap 'if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
apt_install prometheus
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
command -v prometheus >/dev/null 2>&1 || die "prometheus not found after installing Debian's prometheus package"
say "Prometheus $(prometheus --version 2>&1 | head -n 1 | awk '{print $3}') installed (not started: tests run their own)"
