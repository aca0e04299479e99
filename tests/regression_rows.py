"""Reading the `regressions` table back in tests (the product writes it; the report reads it through its own
queries)."""

from __future__ import annotations

import json

from fleetbench.timestamps import utc


def fetch_regressions(engine, dag_id: str | None = None, run_id: str | None = None) -> list[dict]:
    """Rows of `regressions` (optionally one DAG's / run's), `changes` and `baseline_window` decoded."""
    from sqlalchemy import select

    from fleetbench.warehouse.schema import regressions

    query = select(regressions).order_by(regressions.c.run_id, regressions.c.host, regressions.c.case_key,
                                         regressions.c.metric)
    if dag_id:
        query = query.where(regressions.c.dag_id == dag_id)
    if run_id:
        query = query.where(regressions.c.run_id == run_id)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
    for row in rows:
        row["baseline_window"] = json.loads(row["baseline_window"])
        row["changes"] = json.loads(row["changes"]) if row["changes"] else {}
        row["detected_at"] = utc(row["detected_at"]).isoformat()
    return rows


def detect_for_run(engine, dag_id: str, run_id: str, settings=None) -> list[dict]:
    """The regressions of one run, as the DAG's compare step finds them (not stored)."""
    from fleetbench.regression import assess_run

    return assess_run(engine, dag_id, run_id, settings).findings


# -- nights stored and assessed as the DAG's store and report tasks do ----------------------------------------
DAG = "fleet_benchmark"
NIGHT0 = "2026-10-01T02:00:00+00:00"


def night_date(n: int) -> str:
    from datetime import datetime, timedelta

    return (datetime.fromisoformat(NIGHT0) + timedelta(days=n)).isoformat()


def night_run_id(n: int) -> str:
    return f"scheduled__{night_date(n)}"


def night_row(n: int, case_key: str = "c1", host: str = "h1", value: float = 100.0, **extra) -> dict:
    """One ok result of night n: images/sec `value` as the primary metric (override with metric=..., ...)."""
    from warehouse_rows import DERIVED, result_row

    when = night_date(n)
    row = {**DERIVED, **result_row(case_key, run_id=night_run_id(n), host=host, ips=value, logical_date=when,
                                   started_at=when, finished_at=when)}
    row.update(metric="images_per_sec", unit="images/s", better="higher", value=value, step_cv=0.005, step_count=50)
    row.update(extra)
    return row


def store_night(engine, n: int, rows: list[dict]) -> None:
    from fleetbench.warehouse import store_run

    store_run(engine, {"dag_id": DAG, "run_id": night_run_id(n), "logical_date": night_date(n),
                       "run_type": "scheduled", "fleet": "t", "cases_total": len(rows), "cases_ok": len(rows),
                       "cases_failed": 0, "cases_skipped": 0}, [], rows)


def assess_night(engine, n: int, settings=None):
    """Night n assessed and its findings stored, as the report task does; returns the assessment."""
    from fleetbench.regression import assess_run, store_findings

    result = assess_run(engine, DAG, night_run_id(n), settings)
    store_findings(engine, DAG, night_run_id(n), result.findings)
    return result
