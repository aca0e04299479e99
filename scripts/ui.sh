#!/usr/bin/env bash
# `make ui`: Airflow's UI with the fleetbench plugin on this machine. Starts api-server, scheduler,
# dag-processor and triggerer as local processes (LocalExecutor, the SQLite metadata DB of `make run`),
# prints the URL and the login, and runs until Ctrl-C, which stops all four.
#
# Settings (environment): FLEETBENCH_UI_PORT (8080), FLEETBENCH_UI_HOST (127.0.0.1; 0.0.0.0 to listen on
# every interface), FLEETBENCH_UI_USER (admin; SimpleAuthManager's user, role admin), FLEETBENCH_CONFIG,
# FLEETBENCH_WAREHOUSE_URL, AIRFLOW_HOME (.airflow). A configured AIRFLOW__CORE__AUTH_MANAGER is kept.
source "$(dirname "$0")/lib.sh"
source "$FB_ROOT/scripts/airflow-env.sh"

port="${FLEETBENCH_UI_PORT:-8080}"
listen="${FLEETBENCH_UI_HOST:-127.0.0.1}"
# Where this machine reaches the api-server: the address it listens on, or loopback when that is every address.
case "$listen" in 0.0.0.0|::|"[::]") reach=127.0.0.1 ;; *:*) reach="[$listen]" ;; *) reach="$listen" ;; esac
user="${FLEETBENCH_UI_USER:-admin}"
[[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] \
  || die "FLEETBENCH_UI_PORT: '$port' is not a port number (1-65535)"
[[ "$user" =~ ^[A-Za-z0-9_.-]+$ ]] || die "FLEETBENCH_UI_USER: '$user' is not a user name (letters, digits, _ . -)"
if (exec 3<>"/dev/tcp/${reach//[\[\]]/}/$port") 2>/dev/null; then
  die "port $port is in use (another 'make ui'?): stop it, or choose another with FLEETBENCH_UI_PORT=8090 make ui"
fi

logs="$AIRFLOW_HOME/logs/ui"
mkdir -p "$AIRFLOW_HOME" "$FB_ROOT/.data" "$logs"
# Every process signs and checks the same JWTs: one secret, kept so a browser's login survives a restart.
secret_file="$AIRFLOW_HOME/ui-jwt-secret"
[ -s "$secret_file" ] || (umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' >"$secret_file")
export AIRFLOW__API_AUTH__JWT_SECRET="${AIRFLOW__API_AUTH__JWT_SECRET:-$(cat "$secret_file")}"
export AIRFLOW__CORE__EXECUTOR="${AIRFLOW__CORE__EXECUTOR:-LocalExecutor}"
export AIRFLOW__API__PORT="$port"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://$reach:$port/execution/"
export AIRFLOW__API__BASE_URL="${AIRFLOW__API__BASE_URL:-http://$reach:$port}"
simple=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
export AIRFLOW__CORE__AUTH_MANAGER="${AIRFLOW__CORE__AUTH_MANAGER:-$simple}"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-$user:admin}"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-30}"

fleetbench config check "${FLEETBENCH_CONFIG:-$FB_ROOT/include/config/fleet.yaml}" >/dev/null \
  || die "fix the fleet config (errors above) and rerun"
say "initialising Airflow in $AIRFLOW_HOME"
airflow db migrate >"$logs/db-migrate.log" 2>&1 \
  || { tail -n 20 "$logs/db-migrate.log" >&2; die "airflow db migrate failed (log: $logs/db-migrate.log)"; }
fleetbench pools export >"$AIRFLOW_HOME/pools.json"
airflow pools import "$AIRFLOW_HOME/pools.json" >/dev/null 2>&1 || say "warning: could not import pools"

pids=()
names=()
stop() {
  # Each process leads a process group (its task runners included): TERM them all, KILL what is left after 60 s.
  trap - EXIT INT TERM
  local pid end=$((SECONDS + 60))
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    while kill -0 -- "-$pid" 2>/dev/null; do
      [ $SECONDS -ge $end ] && { kill -KILL -- "-$pid" 2>/dev/null || true; }
      sleep 0.5
    done
  done
}
trap stop EXIT
trap 'say "stopping"; exit 0' INT TERM
start() {
  local name=$1; shift
  setsid airflow "$@" >"$logs/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}
alive() {
  local i
  for i in "${!pids[@]}"; do
    kill -0 "${pids[$i]}" 2>/dev/null || { tail -n 30 "$logs/${names[$i]}.log" >&2; die "${names[$i]} exited (log: $logs/${names[$i]}.log)"; }
  done
}
# The api-server first: the scheduler's tasks report to it (the execution API), and on a small machine a
# task started while it is still loading times out.
say "starting the api-server on $listen:$port (logs: $logs)"
start api-server api-server --host "$listen" --port "$port" --workers 1
end=$((SECONDS + 300))
until curl -fsS "http://$reach:$port/api/v2/monitor/health" >/dev/null 2>&1; do
  alive
  [ $SECONDS -ge $end ] && die "the api-server did not answer in 300 s (log: $logs/api-server.log)"
  sleep 1
done
say "starting the scheduler, dag-processor and triggerer"
start scheduler scheduler
start dag-processor dag-processor
start triggerer triggerer
sleep 2
alive

echo
echo "fleetbench UI: http://$reach:$port   (Ctrl-C stops it)"
if [ "$AIRFLOW__CORE__AUTH_MANAGER" = "$simple" ]; then
  passwords="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated}"
  password="$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$passwords" "$user" 2>/dev/null)" \
    || die "no password for $user in $passwords"
  echo "  login:    $user / $password   (kept in $passwords)"
else
  echo "  login:    as $AIRFLOW__CORE__AUTH_MANAGER is configured"
fi
echo "  trigger:  http://$reach:$port/dags/fleet_benchmark  (Trigger, then pick hosts and models)"
echo "  results:  http://$reach:$port/plugin/fleetbench"
echo "  logs:     $logs"
echo
while :; do
  alive
  sleep 2
done
