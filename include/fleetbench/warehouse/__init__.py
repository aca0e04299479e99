"""The warehouse: SQLite by default (`.data/warehouse.db`), PostgreSQL in production.

`FLEETBENCH_WAREHOUSE_URL` picks the database. Writes are idempotent and atomic: one run's rows
are upserted in one transaction keyed by (dag_id, run_id, host, case_key), so a retry replaces its
own rows and a failure mid-write leaves nothing partial; a rerun that executed a case again adds an
attempt and keeps the earlier one in `superseded_results` (`attempts`). Writers that race on the same
keys (a task retried while its first try still writes) serialise on the run's row; rows are written
in key order, and a transaction the database aborts to break a deadlock is retried whole.

Modules: `engine` (URLs, engines, Alembic migrations), `store` (a run in one transaction), `attempts`
(which execution of a case is current, superseded ones), `read` (results, the latest run, the
capacity view), `fit` (values fitted to their columns), `rollup`,
`bulk` (PostgreSQL COPY), `schema`, `rows` (the run's own rows).

The same transaction rewrites the run's rollups (`fleetbench.warehouse.rollup`: per run and host,
per run and case across the fleet) from its stored results, so the report's aggregates never
disagree with the rows they summarise.
"""

from fleetbench.warehouse.engine import (
    MIGRATIONS,
    NotAWarehouse,
    SchemaBehind,
    WarehouseTooNew,
    WarehouseURLError,
    current_revision,
    downgrade,
    existing_engine,
    get_engine,
    redact,
    schema_behind,
    upgrade,
    warehouse_display_url,
    warehouse_read_url,
    warehouse_url,
)
from fleetbench.warehouse.read import dag_ids, fetch_capacity_features, fetch_results, latest_run_id
from fleetbench.warehouse.store import WRITE_ATTEMPTS, store_run, upsert_rows

__all__ = ["MIGRATIONS", "WRITE_ATTEMPTS", "NotAWarehouse", "SchemaBehind", "WarehouseTooNew", "WarehouseURLError",
           "current_revision", "downgrade", "dag_ids", "existing_engine", "fetch_capacity_features", "fetch_results",
           "get_engine", "latest_run_id", "redact", "schema_behind", "store_run", "upgrade", "upsert_rows",
           "warehouse_display_url", "warehouse_read_url", "warehouse_url"]
