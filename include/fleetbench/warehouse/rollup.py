"""The rollups of benchmark_results (tables `run_host_rollup`, `host_month_rollup`, `run_case_rollup`,
revision 0004).

`store_run` calls `refresh` in the transaction that writes a run's results: each run it touched has
its rollup rows deleted and computed again from its result rows as they are after the write, and so
has each month it falls in, so a rerun, a partial write or a second writer of the same run (which
waits for the first on the run's row) always leaves the rollups equal to an aggregate of the stored
results. Writers of different runs of one month take turns on the month's rewrite (PostgreSQL: an
advisory lock; SQLite has one writer at a time anyway). Plain SQL that SQLite and PostgreSQL both
run; migration 0004 runs a frozen copy of the same statements over everything stored.

What the report reads from them (`fleetbench.report.queries`):

- run_host_rollup, one row per (dag_id, run_id, host, model, gpu, driver_version, logical_date):
  case counts by status, the newest stored_at, the highest GPU model reported, sums and counts of
  images per joule and cost per million images of ok results (means are sum / n), and `scaled_gpus`,
  a bit mask of the GPU counts n (2 <= n <= 62) that had an ok result of n whole GPUs (not MIG instances)
  with a speedup efficiency.
- run_case_rollup, one row per (dag_id, run_id, case_key, gpu, logical_date): the fleet's ok images/sec
  of that case on that GPU type (median, min, max of the finite values, how many, on how many hosts),
  its case counts by status, and the speedup efficiency, energy and cost of its ok results.
- host_month_rollup, run_host_rollup per (dag_id, host, model, gpu, driver_version, calendar month):
  what a window of whole months reads instead of every night (see `fleetbench.report.queries`), with the
  host's runs that month (`host_runs`) and its runs with a result of the row's model (`model_runs`).

`gpu` is gpu_catalog_name, else gpu_model as reported (the report's GPU model); NULL for CPU cases.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterable

from sqlalchemy import DateTime, bindparam, func, select, text, type_coerce

from fleetbench.warehouse.schema import run_host_rollup

# The GPU type a result counts under: its catalog name, else the model as reported; none for a CPU case (num_gpus
# 0), whose row still records the host's GPU as provenance (revision 0017: before, a CPU case on a GPU host was
# counted under that GPU).
GPU = "CASE WHEN num_gpus > 0 THEN COALESCE(gpu_catalog_name, gpu_model) END"
# Finite images/sec: PostgreSQL floats hold NaN (greater than every number there) and infinities;
# SQLite stores NaN as NULL.
FINITE_IPS = "images_per_sec > CAST(-1e308 AS FLOAT) AND images_per_sec < CAST(1e308 AS FLOAT)"
# Energy and cost of ok results, as the report's efficiency section counts them.
ENERGY = """
    SUM(CASE WHEN status = 'ok' AND (images_per_joule IS NOT NULL OR cost_per_million_images_usd IS NOT NULL)
             THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN images_per_joule END),
    SUM(CASE WHEN status = 'ok' AND cost_per_million_images_usd IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN cost_per_million_images_usd END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'measured' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' AND images_per_joule IS NOT NULL AND energy_source = 'estimated' THEN 1 ELSE 0 END)"""
ENERGY_COLUMNS = ("energy_cost_n, images_per_joule_n, images_per_joule_sum, cost_per_million_n, cost_per_million_sum, "
                  "energy_measured, energy_estimated")
STATUS = """
    COUNT(*),
    SUM(CASE WHEN status = 'ok' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'skipped' THEN 1 ELSE 0 END)"""
# The GPU counts of a group's whole-GPU scaling: bit n for an ok result of n whole GPUs with a speedup efficiency
# (revision 0022: not n instances of a MIG profile, which the report counts from the results, `_mig_scaled_hosts`).
SCALED_GPUS = """COALESCE(CAST(SUM(DISTINCT CASE
    WHEN status = 'ok' AND speedup_efficiency IS NOT NULL AND num_gpus BETWEEN 2 AND 62 AND mig_profile IS NULL
    THEN CAST(1 AS BIGINT) << num_gpus END) AS BIGINT), 0)"""
# Bitwise OR of the scaled_gpus masks of a group (SQLite has no such aggregate): bit by bit.
OR_MASKS = " | ".join(f"MAX(h.scaled_gpus & {1 << b})" for b in range(2, 63))


def host_rollup_sql(where: str) -> str:
    """INSERT ... SELECT of run_host_rollup rows from the benchmark_results rows that match `where`."""
    return f"""
INSERT INTO run_host_rollup (dag_id, run_id, host, model, gpu, driver_version, logical_date, stored_at, gpu_model,
    results, ok, failed, skipped, {ENERGY_COLUMNS}, scaled_gpus)
SELECT dag_id, run_id, host, model, {GPU}, driver_version, logical_date, MAX(stored_at), MAX(gpu_model),
    {STATUS},{ENERGY},
    {SCALED_GPUS}
FROM benchmark_results
WHERE {where}
GROUP BY dag_id, run_id, host, model, {GPU}, driver_version, logical_date
"""


def case_rollup_sql(where: str) -> str:
    """INSERT ... SELECT of run_case_rollup rows from the benchmark_results rows that match `where`.

    The median is the mean of the middle one or two of the ranked points (window functions, so both
    databases compute it the same way)."""
    return f"""
INSERT INTO run_case_rollup (dag_id, run_id, case_key, gpu, logical_date, model, num_gpus, batch_size_per_device,
    results, ok, failed, skipped, points, hosts, ips_median, ips_min, ips_max,
    efficiency_n, efficiency_sum, efficiency_min, efficiency_max, {ENERGY_COLUMNS}, mig_profile, nodes)
SELECT dag_id, run_id, case_key, gpu, logical_date, MAX(model), MAX(num_gpus), MAX(batch_size_per_device),{STATUS},
    SUM(point), COUNT(DISTINCT CASE WHEN point = 1 THEN host END),
    AVG(CASE WHEN point = 1 AND rn IN ((points + 1) / 2, (points + 2) / 2) THEN images_per_sec END),
    MIN(CASE WHEN point = 1 THEN images_per_sec END),
    MAX(CASE WHEN point = 1 THEN images_per_sec END),
    SUM(CASE WHEN status = 'ok' AND speedup_efficiency IS NOT NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'ok' THEN speedup_efficiency END),
    MIN(CASE WHEN status = 'ok' THEN speedup_efficiency END),
    MAX(CASE WHEN status = 'ok' THEN speedup_efficiency END),{ENERGY}, MAX(mig_profile), MAX(nodes)
FROM (
    SELECT p.*,
           ROW_NUMBER() OVER (PARTITION BY dag_id, run_id, case_key, gpu, logical_date, point
                              ORDER BY images_per_sec) AS rn,
           SUM(point) OVER (PARTITION BY dag_id, run_id, case_key, gpu, logical_date) AS points
    FROM (
        SELECT dag_id, run_id, case_key, {GPU} AS gpu, logical_date, model, num_gpus, batch_size_per_device, host,
               status, images_per_sec, speedup_efficiency, images_per_joule, cost_per_million_images_usd,
               energy_source, mig_profile, nodes, CASE WHEN status = 'ok' AND {FINITE_IPS} THEN 1 ELSE 0 END AS point
        FROM benchmark_results
        WHERE {where}
    ) p
) r
GROUP BY dag_id, run_id, case_key, gpu, logical_date
"""


# One (DAG, month) from its run_host_rollup rows; :m0, :m1 the month's first instant and the next's. host_runs: the
# host's runs that month (any model); model_runs (revision 0020): its runs with a result of the row's model (a
# model's CPU and GPU cases, or two drivers, are rows of their own: their `runs` added up would count a run twice).
MONTH_SQL = f"""
INSERT INTO host_month_rollup (dag_id, host, model, gpu, driver_version, month, first_date, last_date, last_ok, runs,
    host_runs, model_runs, results, ok, failed, skipped, gpu_model, scaled_gpus)
SELECT h.dag_id, h.host, h.model, h.gpu, h.driver_version, :m0, MIN(h.logical_date), MAX(h.logical_date),
    MAX(CASE WHEN h.ok > 0 THEN h.logical_date END), COUNT(DISTINCT h.run_id), MAX(t.host_runs), MAX(r.model_runs),
    SUM(h.results), SUM(h.ok), SUM(h.failed), SUM(h.skipped), MAX(h.gpu_model), {OR_MASKS}
FROM run_host_rollup h
JOIN (SELECT host, COUNT(DISTINCT run_id) AS host_runs FROM run_host_rollup
      WHERE dag_id = :dag_id AND logical_date >= :m0 AND logical_date < :m1 GROUP BY host) t ON t.host = h.host
JOIN (SELECT host, COALESCE(model, '') AS model_key, COUNT(DISTINCT run_id) AS model_runs FROM run_host_rollup
      WHERE dag_id = :dag_id AND logical_date >= :m0 AND logical_date < :m1 GROUP BY host, COALESCE(model, '')) r
  ON r.host = h.host AND r.model_key = COALESCE(h.model, '')
WHERE h.dag_id = :dag_id AND h.logical_date >= :m0 AND h.logical_date < :m1
GROUP BY h.dag_id, h.host, h.model, h.gpu, h.driver_version
"""

RUN = "dag_id = :dag_id AND run_id = :run_id"
_TS = DateTime(timezone=True)
_HOST_SQL = text(host_rollup_sql(RUN))
_CASE_SQL = text(case_rollup_sql(RUN))
_MONTH_SQL = text(MONTH_SQL).bindparams(bindparam("m0", type_=_TS), bindparam("m1", type_=_TS))
_DELETE_RUN = {table: text(f"DELETE FROM {table} WHERE {RUN}") for table in ("run_host_rollup", "run_case_rollup")}
_DELETE_MONTH = text("DELETE FROM host_month_rollup WHERE dag_id = :dag_id AND month = :m0").bindparams(
    bindparam("m0", type_=_TS))
# pg_advisory_xact_lock namespace of (DAG, month) rollup rewrites ("fbrm").
_MONTH_LOCK = 0x6662_726D


def month_of(value: datetime) -> datetime:
    """The first instant (UTC) of the calendar month of a logical date (naive means UTC)."""
    value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return datetime(value.year, value.month, 1, tzinfo=timezone.utc)


def next_month(month: datetime) -> datetime:
    return month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)


def _months(conn, dag_id: str, run_id: str) -> set[datetime]:
    h = run_host_rollup.c
    return {month_of(d) for (d,) in conn.execute(select(h.logical_date).distinct().where(
        h.dag_id == dag_id, h.run_id == run_id, h.logical_date.is_not(None)))}


def refresh(conn, run_keys: Iterable[tuple[str, str]]) -> None:
    """Recompute the rollup rows of these (dag_id, run_id) runs, and of the months they fall in (before
    and after), from their stored results (caller's transaction)."""
    months: set[tuple[str, datetime]] = set()
    for dag_id, run_id in sorted(set(run_keys)):
        params = {"dag_id": dag_id, "run_id": run_id}
        months |= {(dag_id, m) for m in _months(conn, dag_id, run_id)}  # a rerun may move the run to another night
        for delete in _DELETE_RUN.values():
            conn.execute(delete, params)
        conn.execute(_HOST_SQL, params)
        conn.execute(_CASE_SQL, params)
        months |= {(dag_id, m) for m in _months(conn, dag_id, run_id)}
    for dag_id, month in sorted(months):
        refresh_month(conn, dag_id, month)


def refresh_month(conn, dag_id: str, month: datetime) -> None:
    """Recompute host_month_rollup of one DAG and month from run_host_rollup."""
    if conn.dialect.name == "postgresql":
        # Writers of different runs of one month take turns here (their runs' rows are theirs alone), so
        # each rewrite reads the other's committed rows instead of both leaving a copy.
        conn.execute(text("SELECT pg_advisory_xact_lock(:ns, hashtext(:key))"),
                     {"ns": _MONTH_LOCK, "key": f"{dag_id}/{month.isoformat()}"})
    params = {"dag_id": dag_id, "m0": month, "m1": next_month(month)}
    conn.execute(_DELETE_MONTH, params)
    conn.execute(_MONTH_SQL, params)


# Sorting and grouping every stored result in memory rather than in temporary files (PostgreSQL: this
# transaction only): a year of a 1,000-host fleet takes half the time.
BULK_WORK_MEM = "256MB"


def rebuild(conn) -> None:
    """Recompute every rollup row from all stored results (after a bulk load that bypassed `store_run`)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SET LOCAL work_mem = '{BULK_WORK_MEM}'"))
    for table in ("run_host_rollup", "run_case_rollup", "host_month_rollup"):
        conn.execute(text(f"DELETE FROM {table}"))
    conn.execute(text(host_rollup_sql("1 = 1")))
    conn.execute(text(case_rollup_sql("1 = 1")))
    h = run_host_rollup.c
    spans = conn.execute(select(h.dag_id, type_coerce(func.min(h.logical_date), _TS),
                                type_coerce(func.max(h.logical_date), _TS))
                         .group_by(h.dag_id)).all()
    for dag_id, first, last in spans:
        if first is None:
            continue
        month = month_of(first)
        while month <= month_of(last):
            refresh_month(conn, dag_id, month)
            month = next_month(month)
