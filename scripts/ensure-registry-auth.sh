#!/usr/bin/env bash
# Make sure a second image registry with htpasswd (bcrypt) auth answers on 127.0.0.1:5001, for the
# registry-credentials tests. Debian's docker-registry, loopback only; config, htpasswd and storage
# live outside the checkout (FLEETBENCH_REGISTRY_AUTH_DIR, default /var/lib/fleetbench/registry-auth).
# The test user's password is generated once and kept in $DIR/credentials (user:password, mode 600);
# tests read it from there, so no password is written into the repository.
# dockerd treats 127.0.0.0/8 as insecure registries by default (plain HTTP), so no daemon change is needed.
source "$(dirname "$0")/lib.sh"

ADDR="${FLEETBENCH_REGISTRY_AUTH:-127.0.0.1:5001}"
DIR="${FLEETBENCH_REGISTRY_AUTH_DIR:-/var/lib/fleetbench/registry-auth}"
USER_NAME="fleetbench"
CONFIG="$DIR/config.yml"

# The registry is up with auth when /v2/ refuses anonymous access and accepts the stored user.
registry_ok() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://$ADDR/v2/")" = 401 ] &&
    curl -fsS -m 2 -u "$(cat "$DIR/credentials")" "http://$ADDR/v2/" >/dev/null 2>&1
}

[ -r "$DIR/credentials" ] && registry_ok && exit 0
apt_install docker-registry apache2-utils curl
mkdir -p "$DIR/data"
chmod 700 "$DIR"
if [ ! -s "$DIR/credentials" ]; then
  umask 077
  printf '%s:%s\n' "$USER_NAME" "$(head -c 18 /dev/urandom | base64 | tr -d '/+=')" >"$DIR/credentials"
fi
password="$(cut -d: -f2- "$DIR/credentials")"
htpasswd -Bbn "$USER_NAME" "$password" >"$DIR/htpasswd.new" && mv "$DIR/htpasswd.new" "$DIR/htpasswd"
cat >"$CONFIG.new" <<YAML
# Written by scripts/ensure-registry-auth.sh: fleetbench's registry with htpasswd auth, loopback only.
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR/data
  delete:
    enabled: true
http:
  addr: $ADDR
  headers:
    X-Content-Type-Options: [nosniff]
auth:
  htpasswd:
    realm: fleetbench-registry-auth
    path: $DIR/htpasswd
YAML
mv "$CONFIG.new" "$CONFIG"
running="$(pgrep -f "docker-registry serve $CONFIG" || true)"
if [ -n "$running" ]; then
  # Running, but not accepting the stored credentials: docker-registry 2.8 reads htpasswd only at start.
  wait_for 5 registry-auth registry_ok ||
    die "docker-registry (pid $running) runs on $ADDR but refuses $DIR/credentials; stop it (kill $running) and rerun"
else
  say "starting docker-registry with htpasswd auth on $ADDR (log: $FB_STATE/registry-auth.log)"
  nohup docker-registry serve "$CONFIG" >"$FB_STATE/registry-auth.log" 2>&1 &
fi
wait_for 30 registry-auth registry_ok || die "registry with auth did not answer on $ADDR within 30 s; see $FB_STATE/registry-auth.log"
say "registry with htpasswd auth answers on $ADDR (credentials: $DIR/credentials)"
