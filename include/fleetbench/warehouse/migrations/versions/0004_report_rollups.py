"""Rollups of benchmark_results for the report, and an index of a (host, case)'s results by night.

- run_host_rollup: per run, host, model, GPU type, driver and logical date: case counts by status,
  the newest stored_at, energy and cost sums, the GPU counts that had a speedup efficiency.
- host_month_rollup: run_host_rollup per DAG, host, model, GPU type, driver and calendar month (UTC).
- run_case_rollup: the fleet per run, case, GPU type and logical date: case counts by status, ok
  images/sec over the hosts (median, min, max, points, hosts), speedup efficiency, energy and cost.
- ix_benchmark_results_host_case_date: a (host, case)'s results by logical date (open regressions,
  one host's throughput series).

`store_run` rewrites a run's rollup rows, and its month's, in the transaction that writes its results
(`fleetbench.warehouse.rollup`); this revision fills the tables from the rows already stored, with
the statements below (a copy of that module's SQL as of this revision). A year of a 1,000-host fleet
(7.3 million results) takes a minute or two on PostgreSQL, a few on SQLite.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)

BACKFILL_HOSTS = """
INSERT INTO run_host_rollup (dag_id, run_id, host, model, gpu, driver_version, logical_date, stored_at, gpu_model,
    results, ok, failed, skipped, energy_cost_n, images_per_joule_n, images_per_joule_sum, cost_per_million_n, cost_per_million_sum, energy_measured, energy_estimated, scaled_gpus)
SELECT dag_id, run_id, host, model, COALESCE(gpu_catalog_name, gpu_model), driver_version, logical_date, MAX(stored_at), MAX(gpu_model),
    COUNT(*),
    SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'skipped' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND (images_per_joule IS NOT NULL OR cost_per_million_images_usd IS NOT NULL)
             THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN images_per_joule END),
    SUM(CASE WHEN status = 'ok' AND cost_per_million_images_usd IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN cost_per_million_images_usd END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'measured' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'estimated' THEN 1 ELSE 0 END),
    COALESCE(CAST(SUM(DISTINCT CASE WHEN status = 'ok' AND speedup_efficiency IS NOT NULL AND num_gpus BETWEEN 2 AND 62
                                    THEN CAST(1 AS BIGINT) << num_gpus END) AS BIGINT), 0)
FROM benchmark_results
GROUP BY dag_id, run_id, host, model, COALESCE(gpu_catalog_name, gpu_model), driver_version, logical_date
"""

BACKFILL_CASES = """
INSERT INTO run_case_rollup (dag_id, run_id, case_key, gpu, logical_date, model, num_gpus, batch_size_per_device,
    results, ok, failed, skipped, points, hosts, ips_median, ips_min, ips_max,
    efficiency_n, efficiency_sum, efficiency_min, efficiency_max, energy_cost_n, images_per_joule_n, images_per_joule_sum, cost_per_million_n, cost_per_million_sum, energy_measured, energy_estimated)
SELECT dag_id, run_id, case_key, gpu, logical_date, MAX(model), MAX(num_gpus), MAX(batch_size_per_device),
    COUNT(*),
    SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'skipped' THEN 1 ELSE 0 END),
    SUM(point), COUNT(DISTINCT CASE WHEN point = 1 THEN host END),
    AVG(CASE WHEN point = 1 AND rn IN ((points + 1) / 2, (points + 2) / 2) THEN images_per_sec END),
    MIN(CASE WHEN point = 1 THEN images_per_sec END),
    MAX(CASE WHEN point = 1 THEN images_per_sec END),
    SUM(CASE WHEN status = 'ok' AND speedup_efficiency IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN speedup_efficiency END),
    MIN(CASE WHEN status = 'ok' THEN speedup_efficiency END),
    MAX(CASE WHEN status = 'ok' THEN speedup_efficiency END),
    SUM(CASE WHEN status = 'ok' AND (images_per_joule IS NOT NULL OR cost_per_million_images_usd IS NOT NULL)
             THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN images_per_joule END),
    SUM(CASE WHEN status = 'ok' AND cost_per_million_images_usd IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN cost_per_million_images_usd END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'measured' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'estimated' THEN 1 ELSE 0 END)
FROM (
    SELECT p.*,
           ROW_NUMBER() OVER (PARTITION BY dag_id, run_id, case_key, gpu, logical_date, point
                              ORDER BY images_per_sec) AS rn,
           SUM(point) OVER (PARTITION BY dag_id, run_id, case_key, gpu, logical_date) AS points
    FROM (
        SELECT dag_id, run_id, case_key, COALESCE(gpu_catalog_name, gpu_model) AS gpu, logical_date, model, num_gpus, batch_size_per_device, host,
               status, images_per_sec, speedup_efficiency, images_per_joule, cost_per_million_images_usd,
               energy_source, CASE WHEN status = 'ok' AND images_per_sec > CAST(-1e308 AS FLOAT) AND images_per_sec < CAST(1e308 AS FLOAT) THEN 1 ELSE 0 END AS point
        FROM benchmark_results
    ) p
) r
GROUP BY dag_id, run_id, case_key, gpu, logical_date
"""

# One (DAG, month) from its run_host_rollup rows; :m0, :m1 the month's first instant and the next's.
BACKFILL_MONTH = """
INSERT INTO host_month_rollup (dag_id, host, model, gpu, driver_version, month, first_date, last_date, last_ok, runs,
    host_runs, results, ok, failed, skipped, gpu_model, scaled_gpus)
SELECT h.dag_id, h.host, h.model, h.gpu, h.driver_version, :m0, MIN(h.logical_date), MAX(h.logical_date),
    MAX(CASE WHEN h.ok > 0 THEN h.logical_date END), COUNT(DISTINCT h.run_id), MAX(t.host_runs),
    SUM(h.results), SUM(h.ok), SUM(h.failed), SUM(h.skipped), MAX(h.gpu_model), MAX(h.scaled_gpus & 4) | MAX(h.scaled_gpus & 8) | MAX(h.scaled_gpus & 16) | MAX(h.scaled_gpus & 32) | MAX(h.scaled_gpus & 64) | MAX(h.scaled_gpus & 128) | MAX(h.scaled_gpus & 256) | MAX(h.scaled_gpus & 512) | MAX(h.scaled_gpus & 1024) | MAX(h.scaled_gpus & 2048) | MAX(h.scaled_gpus & 4096) | MAX(h.scaled_gpus & 8192) | MAX(h.scaled_gpus & 16384) | MAX(h.scaled_gpus & 32768) | MAX(h.scaled_gpus & 65536) | MAX(h.scaled_gpus & 131072) | MAX(h.scaled_gpus & 262144) | MAX(h.scaled_gpus & 524288) | MAX(h.scaled_gpus & 1048576) | MAX(h.scaled_gpus & 2097152) | MAX(h.scaled_gpus & 4194304) | MAX(h.scaled_gpus & 8388608) | MAX(h.scaled_gpus & 16777216) | MAX(h.scaled_gpus & 33554432) | MAX(h.scaled_gpus & 67108864) | MAX(h.scaled_gpus & 134217728) | MAX(h.scaled_gpus & 268435456) | MAX(h.scaled_gpus & 536870912) | MAX(h.scaled_gpus & 1073741824) | MAX(h.scaled_gpus & 2147483648) | MAX(h.scaled_gpus & 4294967296) | MAX(h.scaled_gpus & 8589934592) | MAX(h.scaled_gpus & 17179869184) | MAX(h.scaled_gpus & 34359738368) | MAX(h.scaled_gpus & 68719476736) | MAX(h.scaled_gpus & 137438953472) | MAX(h.scaled_gpus & 274877906944) | MAX(h.scaled_gpus & 549755813888) | MAX(h.scaled_gpus & 1099511627776) | MAX(h.scaled_gpus & 2199023255552) | MAX(h.scaled_gpus & 4398046511104) | MAX(h.scaled_gpus & 8796093022208) | MAX(h.scaled_gpus & 17592186044416) | MAX(h.scaled_gpus & 35184372088832) | MAX(h.scaled_gpus & 70368744177664) | MAX(h.scaled_gpus & 140737488355328) | MAX(h.scaled_gpus & 281474976710656) | MAX(h.scaled_gpus & 562949953421312) | MAX(h.scaled_gpus & 1125899906842624) | MAX(h.scaled_gpus & 2251799813685248) | MAX(h.scaled_gpus & 4503599627370496) | MAX(h.scaled_gpus & 9007199254740992) | MAX(h.scaled_gpus & 18014398509481984) | MAX(h.scaled_gpus & 36028797018963968) | MAX(h.scaled_gpus & 72057594037927936) | MAX(h.scaled_gpus & 144115188075855872) | MAX(h.scaled_gpus & 288230376151711744) | MAX(h.scaled_gpus & 576460752303423488) | MAX(h.scaled_gpus & 1152921504606846976) | MAX(h.scaled_gpus & 2305843009213693952) | MAX(h.scaled_gpus & 4611686018427387904)
FROM run_host_rollup h
JOIN (SELECT host, COUNT(DISTINCT run_id) AS host_runs FROM run_host_rollup
      WHERE dag_id = :dag_id AND logical_date >= :m0 AND logical_date < :m1 GROUP BY host) t ON t.host = h.host
WHERE h.dag_id = :dag_id AND h.logical_date >= :m0 AND h.logical_date < :m1
GROUP BY h.dag_id, h.host, h.model, h.gpu, h.driver_version
"""

def energy_columns():
    return [sa.Column("energy_cost_n", sa.Integer, nullable=False),
            sa.Column("images_per_joule_n", sa.Integer, nullable=False),
            sa.Column("images_per_joule_sum", sa.Float),
            sa.Column("cost_per_million_n", sa.Integer, nullable=False),
            sa.Column("cost_per_million_sum", sa.Float),
            sa.Column("energy_measured", sa.Integer, nullable=False),
            sa.Column("energy_estimated", sa.Integer, nullable=False)]


def status_columns():
    return [sa.Column(name, sa.Integer, nullable=False) for name in ("results", "ok", "failed", "skipped")]


def upgrade() -> None:
    op.create_table(
        "run_host_rollup",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("host", sa.String(100), nullable=False),
        sa.Column("model", sa.String(100)),
        sa.Column("gpu", sa.String(200)),
        sa.Column("driver_version", sa.String(50)),
        sa.Column("logical_date", TZ),
        sa.Column("stored_at", TZ),
        sa.Column("gpu_model", sa.String(200)),
        *status_columns(),
        *energy_columns(),
        sa.Column("scaled_gpus", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "host_month_rollup",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("host", sa.String(100), nullable=False),
        sa.Column("model", sa.String(100)),
        sa.Column("gpu", sa.String(200)),
        sa.Column("driver_version", sa.String(50)),
        sa.Column("month", TZ, nullable=False),
        sa.Column("first_date", TZ),
        sa.Column("last_date", TZ),
        sa.Column("last_ok", TZ),
        sa.Column("runs", sa.Integer, nullable=False),
        sa.Column("host_runs", sa.Integer, nullable=False),
        *status_columns(),
        sa.Column("gpu_model", sa.String(200)),
        sa.Column("scaled_gpus", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "run_case_rollup",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("case_key", sa.String(250), nullable=False),
        sa.Column("gpu", sa.String(200)),
        sa.Column("logical_date", TZ),
        sa.Column("model", sa.String(100)),
        sa.Column("num_gpus", sa.Integer),
        sa.Column("batch_size_per_device", sa.Integer),
        *status_columns(),
        sa.Column("points", sa.Integer, nullable=False),
        sa.Column("hosts", sa.Integer, nullable=False),
        sa.Column("ips_median", sa.Float),
        sa.Column("ips_min", sa.Float),
        sa.Column("ips_max", sa.Float),
        sa.Column("efficiency_n", sa.Integer, nullable=False),
        sa.Column("efficiency_sum", sa.Float),
        sa.Column("efficiency_min", sa.Float),
        sa.Column("efficiency_max", sa.Float),
        *energy_columns(),
    )
    if op.get_bind().dialect.name == "postgresql":  # sort and group in memory (this transaction only)
        op.execute("SET LOCAL work_mem = '256MB'")
    op.execute(BACKFILL_HOSTS)
    op.execute(BACKFILL_CASES)
    # Indexes after the bulk of the rows: built once from sorted rows instead of row by row.
    op.create_index("ix_run_host_rollup_run", "run_host_rollup", ["dag_id", "run_id"])
    op.create_index("ix_run_host_rollup_date", "run_host_rollup", ["logical_date"])
    op.create_index("ix_run_host_rollup_host_date", "run_host_rollup", ["host", "logical_date"])
    op.create_index("ix_run_host_rollup_model_date", "run_host_rollup", ["model", "logical_date"])
    op.create_index("ix_run_case_rollup_run", "run_case_rollup", ["dag_id", "run_id"])
    op.create_index("ix_run_case_rollup_date", "run_case_rollup", ["logical_date"])
    op.create_index("ix_host_month_rollup_dag_month", "host_month_rollup", ["dag_id", "month"])
    op.create_index("ix_host_month_rollup_month", "host_month_rollup", ["month"])
    backfill_months()
    op.create_index("ix_benchmark_results_host_case_date", "benchmark_results", ["host", "case_key", "logical_date"])


def _utc(value) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _next(month: datetime) -> datetime:
    return month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)


def backfill_months() -> None:
    """host_month_rollup of every DAG and month from first to last logical date (one statement per month)."""
    bind = op.get_bind()
    month_sql = sa.text(BACKFILL_MONTH).bindparams(sa.bindparam("m0", type_=TZ), sa.bindparam("m1", type_=TZ))
    spans = bind.execute(sa.text("SELECT dag_id, MIN(logical_date), MAX(logical_date) FROM run_host_rollup "
                                 "WHERE logical_date IS NOT NULL GROUP BY dag_id")).all()
    for dag_id, first, last in spans:
        first, last = _utc(first), _utc(last)
        month, end = datetime(first.year, first.month, 1, tzinfo=timezone.utc), datetime(last.year, last.month, 1, tzinfo=timezone.utc)
        while month <= end:
            bind.execute(month_sql, {"dag_id": dag_id, "m0": month, "m1": _next(month)})
            month = _next(month)


def downgrade() -> None:
    op.drop_index("ix_benchmark_results_host_case_date", table_name="benchmark_results")
    for table in ("run_case_rollup", "host_month_rollup", "run_host_rollup"):
        op.drop_table(table)
