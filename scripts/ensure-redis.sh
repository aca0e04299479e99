#!/usr/bin/env bash
# Make sure a Redis server (the Celery broker of a CeleryExecutor deployment) answers on
# 127.0.0.1:6379 (Debian's redis-server, loopback only, no persistence: a broker holds only
# queued task messages). The Celery test (tests/integration/test_celery_fleet.py) starts its own
# redis-server on a free port with this binary; this shared one is for `make fleet-celery` and
# for trying a CeleryExecutor deployment by hand.
source "$(dirname "$0")/lib.sh"

PORT="${FLEETBENCH_REDIS_PORT:-6379}"
DIR="$FB_STATE/redis"
redis_ok() { [ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" = PONG ]; }

command -v redis-cli >/dev/null 2>&1 && redis_ok && exit 0
apt_install redis-server redis-tools
if ! redis_ok; then
  mkdir -p "$DIR"
  say "starting redis-server on 127.0.0.1:$PORT (log: $DIR/redis.log)"
  # The Debian package may have started its own instance (init scripts), also on 127.0.0.1:6379: then
  # redis_ok is already true above. Otherwise start one that listens on loopback only.
  redis-server --bind 127.0.0.1 --port "$PORT" --protected-mode yes --daemonize yes \
    --dir "$DIR" --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" --save '' --appendonly no
fi
wait_for 15 redis redis_ok || die "Redis did not answer on 127.0.0.1:$PORT; see $DIR/redis.log"
say "Redis answers on 127.0.0.1:$PORT"
