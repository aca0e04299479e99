#!/usr/bin/env bash
# `make run`: run fleet_benchmark once with `airflow dags test` and print the results table.
# Exits non-zero when the DAG run failed.
source "$(dirname "$0")/lib.sh"
source "$FB_ROOT/scripts/airflow-env.sh"

mkdir -p "$AIRFLOW_HOME" "$FB_ROOT/.data"
fleetbench config check "${FLEETBENCH_CONFIG:-$FB_ROOT/include/config/fleet.yaml}" >/dev/null \
  || die "fix the fleet config (errors above) and rerun"
say "initialising Airflow in $AIRFLOW_HOME"
airflow db migrate >"$FB_ROOT/.data/airflow-migrate.log" 2>&1 \
  || { tail -n 20 "$FB_ROOT/.data/airflow-migrate.log" >&2; die "airflow db migrate failed"; }
# One single-slot pool per host, for configs with fleet.host_pools (`dags test` ignores pools).
fleetbench pools export >"$FB_ROOT/.data/pools.json"
airflow pools import "$FB_ROOT/.data/pools.json" >/dev/null 2>&1 || say "warning: could not import pools"
log="$FB_ROOT/.data/last-run.log"
say "running fleet_benchmark with 'airflow dags test' (task log: $log)"
set +e
airflow dags test fleet_benchmark >"$log" 2>&1
rc=$?
set -e
run_id="$(grep -o 'run_id=[^,]*' "$log" | tail -n 1 | cut -d= -f2- || true)"  # none: the run never started
echo
if [ -n "$run_id" ]; then
  fleetbench results --run-id "$run_id" || true
fi
if [ $rc -ne 0 ]; then
  grep -E 'ERROR|Error|error' "$log" | tail -n 15 >&2 || true
  die "the DAG run failed (exit $rc); full log: $log"
fi
say "done: run $run_id"
