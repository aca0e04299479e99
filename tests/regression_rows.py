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
