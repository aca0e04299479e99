"""The warehouse's write contract, run against SQLite (unit) and PostgreSQL (integration)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from fleetbench.warehouse import fetch_results, latest_run_id, store_run, upgrade
from fleetbench.warehouse.schema import benchmark_results, runs, steps
from warehouse_rows import result_row, run_row, step_rows


def count(engine, table, **where) -> int:
    query = select(func.count()).select_from(table)
    for k, v in where.items():
        query = query.where(table.c[k] == v)
    with engine.connect() as conn:
        return conn.execute(query).scalar()


def check_store_and_rerun_replaces(engine):
    upgrade(engine)
    upgrade(engine)  # idempotent
    store_run(engine, run_row(), [], [result_row("a"), result_row("b")], step_rows("a", 3) + step_rows("b", 3))
    assert count(engine, benchmark_results) == 2 and count(engine, steps) == 6
    # A retry of the same run writes new numbers and fewer steps: replaced, not duplicated.
    store_run(engine, run_row(), [], [result_row("a", ips=200.0), result_row("b")], step_rows("a", 2) + step_rows("b", 3))
    assert count(engine, benchmark_results) == 2 and count(engine, runs) == 1
    assert count(engine, steps, case_key="a") == 2
    rows = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}
    assert rows["a"]["images_per_sec"] == 200.0
    assert rows["a"]["started_at"] == "2026-12-01T02:00:05+00:00"
    assert rows["a"]["command"] == '["python", "x.py"]'
    # Another run adds rows; the latest run is found.
    store_run(engine, {**run_row("r2"), "finished_at": "2026-12-02T02:10:00+00:00"}, [], [result_row("a", run_id="r2")])
    assert count(engine, benchmark_results) == 3
    assert latest_run_id(engine) == "r2"


def check_failed_write_leaves_nothing(engine):
    upgrade(engine)
    bad = result_row("b")
    bad["status"] = None  # NOT NULL: the second row fails inside the transaction
    with pytest.raises(Exception):
        store_run(engine, run_row("r9"), [], [result_row("a", run_id="r9"), {**bad, "run_id": "r9"}], step_rows("a", 3, run_id="r9"))
    assert count(engine, benchmark_results, run_id="r9") == 0
    assert count(engine, steps, run_id="r9") == 0
    assert count(engine, runs, run_id="r9") == 0
