"""CPU cases out of their host's GPU type in the rollups.

The rollups counted a result under COALESCE(gpu_catalog_name, gpu_model). A CPU case (num_gpus 0) on a GPU host
records the host's GPU in gpu_model (provenance), so the report's efficiency table and the GPU columns of the
rollups put it under that GPU instead of "none (CPU)", and where the GPU was not in the catalog its images per
joule and cost were averaged with the GPU cases'. The expression is now CASE WHEN num_gpus > 0 THEN
COALESCE(gpu_catalog_name, gpu_model) END (`fleetbench.warehouse.rollup.GPU`).

This revision recomputes the rollup rows of every run that has such a CPU result, and of the months those runs
fall in, with the statements below (a copy of `fleetbench.warehouse.rollup`'s SQL as of this revision, the GPU
expression a parameter); other runs' rows are already right. Downgrade recomputes the same runs with the old
expression. No table changes shape.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
NEW_GPU = "CASE WHEN num_gpus > 0 THEN COALESCE(gpu_catalog_name, gpu_model) END"
OLD_GPU = "COALESCE(gpu_catalog_name, gpu_model)"
# The runs whose rollups the two expressions make differ: a CPU result that carries a GPU name.
AFFECTED = ("SELECT DISTINCT dag_id, run_id FROM benchmark_results "
            "WHERE num_gpus = 0 AND COALESCE(gpu_catalog_name, gpu_model) IS NOT NULL")
RUN = "dag_id = :dag_id AND run_id = :run_id"
ENERGY_COLUMNS = ("energy_cost_n, images_per_joule_n, images_per_joule_sum, cost_per_million_n, cost_per_million_sum, "
                  "energy_measured, energy_estimated")
ENERGY = """
    SUM(CASE WHEN status = 'ok' AND (images_per_joule IS NOT NULL OR cost_per_million_images_usd IS NOT NULL)
             THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN images_per_joule END),
    SUM(CASE WHEN status = 'ok' AND cost_per_million_images_usd IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN cost_per_million_images_usd END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'measured' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'estimated' THEN 1 ELSE 0 END)"""
STATUS = """
    COUNT(*),
    SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'skipped' THEN 1 ELSE 0 END)"""
FINITE_IPS = "images_per_sec > CAST(-1e308 AS FLOAT) AND images_per_sec < CAST(1e308 AS FLOAT)"
OR_MASKS = " | ".join(f"MAX(h.scaled_gpus & {1 << b})" for b in range(2, 63))


def host_sql(gpu: str) -> str:
    return f"""
INSERT INTO run_host_rollup (dag_id, run_id, host, model, gpu, driver_version, logical_date, stored_at, gpu_model,
    results, ok, failed, skipped, {ENERGY_COLUMNS}, scaled_gpus)
SELECT dag_id, run_id, host, model, {gpu}, driver_version, logical_date, MAX(stored_at), MAX(gpu_model),
    {STATUS},{ENERGY},
    COALESCE(CAST(SUM(DISTINCT CASE WHEN status = 'ok' AND speedup_efficiency IS NOT NULL AND num_gpus BETWEEN 2 AND 62
                                    THEN CAST(1 AS BIGINT) << num_gpus END) AS BIGINT), 0)
FROM benchmark_results
WHERE {RUN}
GROUP BY dag_id, run_id, host, model, {gpu}, driver_version, logical_date
"""


def case_sql(gpu: str) -> str:
    return f"""
INSERT INTO run_case_rollup (dag_id, run_id, case_key, gpu, logical_date, model, num_gpus, batch_size_per_device,
    results, ok, failed, skipped, points, hosts, ips_median, ips_min, ips_max,
    efficiency_n, efficiency_sum, efficiency_min, efficiency_max, {ENERGY_COLUMNS})
SELECT dag_id, run_id, case_key, gpu, logical_date, MAX(model), MAX(num_gpus), MAX(batch_size_per_device),{STATUS},
    SUM(point), COUNT(DISTINCT CASE WHEN point = 1 THEN host END),
    AVG(CASE WHEN point = 1 AND rn IN ((points + 1) / 2, (points + 2) / 2) THEN images_per_sec END),
    MIN(CASE WHEN point = 1 THEN images_per_sec END),
    MAX(CASE WHEN point = 1 THEN images_per_sec END),
    SUM(CASE WHEN status = 'ok' AND speedup_efficiency IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN speedup_efficiency END),
    MIN(CASE WHEN status = 'ok' THEN speedup_efficiency END),
    MAX(CASE WHEN status = 'ok' THEN speedup_efficiency END),{ENERGY}
FROM (
    SELECT p.*,
           ROW_NUMBER() OVER (PARTITION BY dag_id, run_id, case_key, gpu, logical_date, point
                              ORDER BY images_per_sec) AS rn,
           SUM(point) OVER (PARTITION BY dag_id, run_id, case_key, gpu, logical_date) AS points
    FROM (
        SELECT dag_id, run_id, case_key, {gpu} AS gpu, logical_date, model, num_gpus, batch_size_per_device, host,
               status, images_per_sec, speedup_efficiency, images_per_joule, cost_per_million_images_usd,
               energy_source, CASE WHEN status = 'ok' AND {FINITE_IPS} THEN 1 ELSE 0 END AS point
        FROM benchmark_results
        WHERE {RUN}
    ) p
) r
GROUP BY dag_id, run_id, case_key, gpu, logical_date
"""


MONTH_SQL = f"""
INSERT INTO host_month_rollup (dag_id, host, model, gpu, driver_version, month, first_date, last_date, last_ok, runs,
    host_runs, results, ok, failed, skipped, gpu_model, scaled_gpus)
SELECT h.dag_id, h.host, h.model, h.gpu, h.driver_version, :m0, MIN(h.logical_date), MAX(h.logical_date),
    MAX(CASE WHEN h.ok > 0 THEN h.logical_date END), COUNT(DISTINCT h.run_id), MAX(t.host_runs),
    SUM(h.results), SUM(h.ok), SUM(h.failed), SUM(h.skipped), MAX(h.gpu_model), {OR_MASKS}
FROM run_host_rollup h
JOIN (SELECT host, COUNT(DISTINCT run_id) AS host_runs FROM run_host_rollup
      WHERE dag_id = :dag_id AND logical_date >= :m0 AND logical_date < :m1 GROUP BY host) t ON t.host = h.host
WHERE h.dag_id = :dag_id AND h.logical_date >= :m0 AND h.logical_date < :m1
GROUP BY h.dag_id, h.host, h.model, h.gpu, h.driver_version
"""


def _month(value) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return datetime(value.year, value.month, 1, tzinfo=timezone.utc)


def _next(month: datetime) -> datetime:
    return month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)


def recompute(gpu: str) -> None:
    """The rollup rows of the affected runs with `gpu` as the GPU expression, then their months'."""
    bind = op.get_bind()
    runs = bind.execute(sa.text(AFFECTED)).all()
    if not runs:
        return
    host, case = sa.text(host_sql(gpu)), sa.text(case_sql(gpu))
    months = set()
    for dag_id, run_id in runs:
        params = {"dag_id": dag_id, "run_id": run_id}
        for table in ("run_host_rollup", "run_case_rollup"):
            bind.execute(sa.text(f"DELETE FROM {table} WHERE {RUN}"), params)
        bind.execute(host, params)
        bind.execute(case, params)
        months |= {(dag_id, _month(d)) for (d,) in bind.execute(sa.text(
            f"SELECT DISTINCT logical_date FROM run_host_rollup WHERE {RUN} AND logical_date IS NOT NULL"), params)}
    delete_month = sa.text("DELETE FROM host_month_rollup WHERE dag_id = :dag_id AND month = :m0").bindparams(
        sa.bindparam("m0", type_=TZ))
    month_sql = sa.text(MONTH_SQL).bindparams(sa.bindparam("m0", type_=TZ), sa.bindparam("m1", type_=TZ))
    for dag_id, month in sorted(months):
        params = {"dag_id": dag_id, "m0": month, "m1": _next(month)}
        bind.execute(delete_month, params)
        bind.execute(month_sql, params)


def upgrade() -> None:
    recompute(NEW_GPU)


def downgrade() -> None:
    recompute(OLD_GPU)
