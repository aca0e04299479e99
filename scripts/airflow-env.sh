# Airflow settings for running fleetbench from this checkout (sourced by the Makefile targets).
# Airflow lives in .airflow/ with a SQLite metadata DB; the warehouse defaults to .data/warehouse.db.
FB_ROOT="${FB_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$FB_ROOT/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$FB_ROOT/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$FB_ROOT/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-sqlite:///$AIRFLOW_HOME/airflow.db}"
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW__LOGGING__LOGGING_LEVEL:-INFO}"
export PATH="$FB_ROOT/.venv/bin:$PATH"
