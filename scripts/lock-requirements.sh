#!/usr/bin/env bash
# Regenerate requirements.lock: the exact versions requirements.txt resolves to, as pip resolved them into
# .venv (`pip freeze`, the editable fleetbench excluded), narrowed to what requirements.txt itself needs
# (pip's dry-run report: no test tools). It plays the part of Airflow's published constraints file
# (https://raw.githubusercontent.com/apache/airflow/constraints-<version>/constraints-<python>.txt),
# which lives on GitHub, out of this build's reach. Run after changing requirements.txt, in a venv
# where `pip install -r requirements.txt` has just resolved.
source "$(dirname "$0")/lib.sh"
cd "$FB_ROOT"
PY="$FB_ROOT/.venv/bin/python"
[ -x "$PY" ] || die "no .venv: run 'make venv' first"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip freeze --exclude-editable >"$tmp/freeze.txt"
"$PY" -m pip install --dry-run --ignore-installed --quiet --report "$tmp/report.json" \
  -r requirements.txt -c "$tmp/freeze.txt" 2>/dev/null
airflow="$(sed -n 's/^apache-airflow==\([0-9.]*\).*/\1/p' requirements.txt)"
pyver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
{
  echo "# The resolved dependency set of requirements.txt (apache-airflow $airflow, Python $pyver), used as pip"
  echo "# constraints by 'make venv' and the Dockerfile, as Airflow's own constraints file would be. Airflow"
  echo "# publishes that file on GitHub (constraints-$airflow/constraints-$pyver.txt); this one is generated"
  echo "# from the venv those requirements resolved into. Regenerate: bash scripts/lock-requirements.sh"
  "$PY" -c '
import json, sys
items = json.load(open(sys.argv[1]))["install"]
for name, version in sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in items):
    print(f"{name}=={version}")
' "$tmp/report.json"
} >requirements.lock
say "wrote requirements.lock ($(grep -vc '^#' requirements.lock) packages)"
