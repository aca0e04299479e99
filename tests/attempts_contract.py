"""What the warehouse promises about attempts, checked on SQLite (tests/unit) and PostgreSQL (tests/integration)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from fleetbench.warehouse import current_revision, downgrade, fetch_results, store_run, upgrade
from fleetbench.warehouse.attempts import fetch_attempts
from fleetbench.warehouse.schema import (
    benchmark_results,
    host_facts,
    result_metrics,
    run_case_rollup,
    steps,
    superseded_host_facts,
    superseded_results,
)
from warehouse_contract import HEAD
from warehouse_rows import result_row, run_row, step_rows

DRIVER_A, DRIVER_B = "550.127.05", "590.48.01"


def count(engine, table, **where) -> int:
    with engine.connect() as conn:
        query = select(func.count()).select_from(table)
        for k, v in where.items():
            query = query.where(table.c[k] == v)
        return conn.execute(query).scalar()


def night(attempt: str, driver: str, ips: float, **extra) -> list[dict]:
    """Cases a and b of run r1 as one execution (`attempt` names its container outcomes)."""
    return [result_row(c, ips=ips + i, driver_version=driver, attempt_id=f"{attempt}-{c}", **extra)
            for i, c in enumerate(("a", "b"))]


def sample(case_key: str, metric: str, value: float, unit: str = "images/s", better: str = "higher") -> dict:
    """A result_metrics row of run r1 on the host of `warehouse_rows.result_row`."""
    return {**{k: v for k, v in result_row(case_key).items() if k in ("dag_id", "run_id", "host", "case_key")},
            "metric": metric, "labels": "{}", "value": value, "unit": unit, "better": better}


def superseded(engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            select(superseded_results).order_by(superseded_results.c.case_key, superseded_results.c.attempt))]


def check_rerun_adds_attempts_and_a_retry_replaces(engine):
    upgrade(engine)
    store_run(engine, run_row(), [], night("A", DRIVER_A, 100.0), step_rows("a", 3))
    # The store task retried with the same outcomes (numbers re-derived): the same attempt, replaced in place.
    store_run(engine, run_row(), [], night("A", DRIVER_A, 101.0), step_rows("a", 3))
    assert count(engine, superseded_results) == 0
    assert {(r["case_key"], r["attempt"], r["images_per_sec"]) for r in fetch_results(engine, run_id="r1")} == {
        ("a", 1, 101.0), ("b", 1, 102.0)}

    # The run cleared and rerun on driver B: new outcomes, so new attempts; A's are kept whole.
    store_run(engine, run_row(), [], night("B", DRIVER_B, 200.0), step_rows("a", 2, base=200.0),
              metric_rows=[sample("b", "images_per_sec", 201.0), sample("b", "p99_ms", 7.5, unit="ms", better="lower")])
    current = {r["case_key"]: r for r in fetch_results(engine, run_id="r1")}
    assert {k: (r["attempt"], r["driver_version"], r["images_per_sec"]) for k, r in current.items()} == {
        "a": (2, DRIVER_B, 200.0), "b": (2, DRIVER_B, 201.0)}
    old = superseded(engine)
    assert [(r["case_key"], r["attempt"], r["driver_version"], r["images_per_sec"], r["superseded_by"])
            for r in old] == [("a", 1, DRIVER_A, 101.0, 2), ("b", 1, DRIVER_A, 102.0, 2)]
    assert [s["images_per_sec"] for s in json.loads(old[0]["steps_json"])] == [101.0, 102.0, 103.0]
    assert old[1]["steps_json"] is None and old[0]["attempt_id"] == "A-a"
    assert old[0]["command"] == '["python", "x.py"]' and old[0]["superseded_at"] is not None
    assert count(engine, steps, case_key="a") == 2  # the current attempt's steps
    # Rollups count the current attempt only: one result per case, B's throughput.
    with engine.connect() as conn:
        rollups = conn.execute(select(run_case_rollup.c.case_key, run_case_rollup.c.results,
                                      run_case_rollup.c.ips_median).order_by(run_case_rollup.c.case_key)).all()
    assert [tuple(r) for r in rollups] == [("a", 1, 200.0), ("b", 1, 201.0)]

    # A retry of B's store adds nothing.
    store_run(engine, run_row(), [], night("B", DRIVER_B, 200.0), step_rows("a", 2, base=200.0),
              metric_rows=[sample("b", "images_per_sec", 201.0), sample("b", "p99_ms", 7.5, unit="ms", better="lower")])
    assert count(engine, superseded_results) == 2 and count(engine, benchmark_results) == 2

    every = fetch_attempts(engine, run_id="r1")
    assert [(r["case_key"], r["attempt"], r["current"], r["driver_version"]) for r in every] == [
        ("a", 1, False, DRIVER_A), ("a", 2, True, DRIVER_B), ("b", 1, False, DRIVER_A), ("b", 2, True, DRIVER_B)]
    assert {r["superseded_why"] for r in superseded(engine)} == {f"driver {DRIVER_A} -> {DRIVER_B}"}

    # A rerun that no longer plans b: b's attempt is kept as superseded (by nothing), not deleted, with its
    # metric samples; the current rows have none left for b.
    store_run(engine, run_row(), [], night("C", DRIVER_B, 300.0)[:1])
    b_old = next(r for r in superseded(engine) if (r["case_key"], r["attempt"]) == ("b", 2))
    assert sorted((m["metric"], m["value"], m["unit"], m["better"]) for m in json.loads(b_old["metrics_json"])) == [
        ("images_per_sec", 201.0, "images/s", "higher"), ("p99_ms", 7.5, "ms", "lower")]
    assert count(engine, result_metrics, case_key="b") == 0
    assert [r["case_key"] for r in fetch_results(engine, run_id="r1")] == ["a"]
    assert [(r["case_key"], r["attempt"], r["superseded_by"], r["superseded_why"]) for r in superseded(engine)] == [
        ("a", 1, 2, f"driver {DRIVER_A} -> {DRIVER_B}"), ("a", 2, 3, "rerun"),
        ("b", 1, 2, f"driver {DRIVER_A} -> {DRIVER_B}"), ("b", 2, None, "no longer planned")]
    # b planned again later: attempt 3, after the superseded ones.
    store_run(engine, run_row(), [], night("D", DRIVER_B, 400.0)[1:], complete=False)
    assert {r["case_key"]: r["attempt"] for r in fetch_results(engine, run_id="r1")} == {"a": 3, "b": 3}


def check_failed_rerun_keeps_the_previous_attempt(engine, monkeypatch):
    """The attempt bookkeeping is part of the store's one transaction: a store that fails after moving
    the stored attempt leaves it current and superseded_results as it was."""
    from fleetbench.warehouse import rollup

    upgrade(engine)
    store_run(engine, run_row(), [], night("A", DRIVER_A, 100.0))

    def broken(conn, run_keys):
        raise RuntimeError("rollup failed")

    monkeypatch.setattr(rollup, "refresh", broken)
    with pytest.raises(RuntimeError, match="rollup failed"):
        store_run(engine, run_row(), [], night("B", DRIVER_B, 200.0))
    assert count(engine, superseded_results) == 0
    assert {(r["attempt"], r["driver_version"]) for r in fetch_results(engine, run_id="r1")} == {(1, DRIVER_A)}


def check_migration_makes_stored_rows_attempt_1(engine):
    """Rows stored at revision 0004 become attempt 1 (identity unknown); a rerun after the upgrade adds
    attempt 2 and keeps attempt 1; the downgrade drops the superseded attempts, the current ones stay."""
    from sqlalchemy import MetaData, Table, inspect

    from fleetbench.timestamps import utc

    upgrade(engine, "0004")
    with engine.begin() as conn:
        table = Table("benchmark_results", MetaData(), autoload_with=conn)
        conn.execute(table.insert(), [
            {k: (utc(v) if k in ("logical_date", "started_at", "finished_at") else v) for k, v in r.items()
             if k in table.c and k not in ("command", "attempt_id")} for r in night("A", DRIVER_A, 100.0)])
    upgrade(engine)
    assert current_revision(engine) == HEAD
    assert {(r["attempt"], r["attempt_id"]) for r in fetch_results(engine)} == {(1, None)}
    store_run(engine, run_row(), [], night("B", DRIVER_B, 200.0))
    assert {(r["attempt"], r["driver_version"]) for r in fetch_results(engine)} == {(2, DRIVER_B)}
    assert [(r["attempt"], r["driver_version"]) for r in superseded(engine)] == [(1, DRIVER_A), (1, DRIVER_A)]
    downgrade(engine, "0010")
    assert "superseded_results" not in inspect(engine).get_table_names()
    assert not {"attempt", "attempt_id"} & {c["name"] for c in inspect(engine).get_columns("benchmark_results")}
    assert count(engine, benchmark_results) == 2
    upgrade(engine)
    assert {r["attempt"] for r in fetch_results(engine)} == {1}


def host_check(driver: str, at: str, host: str = "h1", health: str = "healthy", **extra) -> dict:
    """A host_facts row (of run r1 unless `run_id` says otherwise): the host check at `at` found `driver`."""
    return {"dag_id": "fleet_benchmark", "run_id": "r1", "host": host, "verdict": "ready", "reasons": None,
            "kernel": "6.1.0", "docker_version": "26.1.5", "driver_version": driver, "cuda_driver_version": "12.4",
            "gpu_count": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "nvidia_runtime": True,
            "facts_json": json.dumps({"driver": driver}), "checks_json": "[]", "collected_at": at,
            "gpu_health": health, "gpu_health_issues": None, **extra}


def check_superseded_attempts_keep_their_host_check(engine):
    """A rerun's host check no longer overwrites the one the earlier attempt ran under: the stored check moves
    to superseded_host_facts, the superseded attempt names it, and fetch_attempts gives each attempt its own."""
    upgrade(engine)
    check_a = host_check(DRIVER_A, "2026-12-01T02:00:00+00:00")
    store_run(engine, run_row(), [check_a], night("A", DRIVER_A, 100.0, host_gpu_health="healthy"))
    # The store retried with the same check: replaced in place, nothing kept twice.
    store_run(engine, run_row(), [check_a], night("A", DRIVER_A, 100.0, host_gpu_health="healthy"))
    assert count(engine, superseded_host_facts) == 0
    # Cleared and rerun on driver B: a new check (degraded GPUs) and new attempts.
    check_b = host_check(DRIVER_B, "2026-12-02T02:00:00+00:00", health="degraded",
                         gpu_health_issues="gpu_ecc:warn", verdict="degraded")
    store_run(engine, run_row(), [check_b], night("B", DRIVER_B, 200.0, host_gpu_health="degraded"))
    with engine.connect() as conn:
        kept = [dict(r._mapping) for r in conn.execute(select(superseded_host_facts))]
        stored = [dict(r._mapping) for r in conn.execute(select(host_facts))]
    assert [(r["host"], r["driver_version"], r["verdict"], r["gpu_health"], r["facts_json"]) for r in kept] == [
        ("h1", DRIVER_A, "ready", "healthy", json.dumps({"driver": DRIVER_A}))]
    assert kept[0]["superseded_at"] is not None
    assert [(r["driver_version"], r["gpu_health"]) for r in stored] == [(DRIVER_B, "degraded")]
    assert {str(r["host_collected_at"])[:19] for r in superseded(engine)} == {"2026-12-01 02:00:00"}

    every = fetch_attempts(engine, run_id="r1")
    assert [(r["case_key"], r["attempt"], r["current"], r["host_driver_version"], r["host_verdict"],
             r["host_gpu_health"], r["host_gpu_health_issues"], r["host_checked_at"]) for r in every] == [
        ("a", 1, False, DRIVER_A, "ready", "healthy", None, "2026-12-01T02:00:00+00:00"),
        ("a", 2, True, DRIVER_B, "degraded", "degraded", "gpu_ecc:warn", "2026-12-02T02:00:00+00:00"),
        ("b", 1, False, DRIVER_A, "ready", "healthy", None, "2026-12-01T02:00:00+00:00"),
        ("b", 2, True, DRIVER_B, "degraded", "degraded", "gpu_ecc:warn", "2026-12-02T02:00:00+00:00")]

    # Only the cases were run again (the host check's result reused): the attempt is superseded, the check
    # stays stored, and the superseded attempt still finds it there.
    store_run(engine, run_row(), [check_b], night("C", DRIVER_B, 210.0, host_gpu_health="degraded"))
    assert count(engine, superseded_host_facts) == 1
    third = [r for r in fetch_attempts(engine, run_id="r1") if r["case_key"] == "a"]
    assert [(r["attempt"], r["host_driver_version"], r["host_checked_at"][:10]) for r in third] == [
        (1, DRIVER_A, "2026-12-01"), (2, DRIVER_B, "2026-12-02"), (3, DRIVER_B, "2026-12-02")]

    # A complete store without the host (a rerun that planned other hosts only) keeps its check too.
    store_run(engine, run_row(), [host_check(DRIVER_B, "2026-12-03T02:00:00+00:00", host="h2")],
              [result_row("a", host="h2", attempt_id="D-a")])
    with engine.connect() as conn:
        assert sorted((r.host, str(r.collected_at)[:10]) for r in conn.execute(select(superseded_host_facts))) == [
            ("h1", "2026-12-01"), ("h1", "2026-12-02")]
        assert [r.host for r in conn.execute(select(host_facts))] == ["h2"]
    h1_b = [r for r in fetch_attempts(engine, run_id="r1") if r["host"] == "h1" and r["attempt"] == 3]
    assert {(r["current"], r["host_driver_version"], r["host_checked_at"][:10]) for r in h1_b} == {
        (False, DRIVER_B, "2026-12-02")}


def check_migration_keeps_superseded_attempts_without_a_host_check(engine):
    """Attempts superseded at revision 0011 (before 0015) stay as they were (no host check kept: host_* None) after the
    upgrade; the next rerun keeps the replaced check; the downgrade drops the kept checks, never an attempt."""
    from sqlalchemy import MetaData, Table, inspect

    upgrade(engine, "0011")
    store_at_0011 = [{k: v for k, v in r.items() if k != "command"} for r in night("A", DRIVER_A, 100.0)]
    with engine.begin() as conn:  # what 0011's store wrote: current attempt 2 (B), attempt 1 (A) superseded
        md = MetaData()
        br, sr, hf = (Table(t, md, autoload_with=conn) for t in ("benchmark_results", "superseded_results",
                                                                  "host_facts"))
        dated = ("logical_date", "started_at", "finished_at", "collected_at")
        conn.execute(br.insert(), [{k: (utc_of(v) if k in dated else v) for k, v in r.items() if k in br.c}
                                   | {"attempt": 2, "attempt_id": "B-" + r["case_key"], "driver_version": DRIVER_B}
                                   for r in store_at_0011])
        conn.execute(sr.insert(), [{k: (utc_of(v) if k in dated else v) for k, v in r.items() if k in sr.c}
                                   | {"attempt": 1, "superseded_at": utc_of("2026-12-02T03:00:00+00:00"),
                                      "superseded_by": 2, "superseded_why": "driver changed"} for r in store_at_0011])
        conn.execute(hf.insert(), [{k: (utc_of(v) if k in dated else v) for k, v in
                                    host_check(DRIVER_B, "2026-12-02T02:00:00+00:00").items()}])
    upgrade(engine)
    assert current_revision(engine) == HEAD
    every = fetch_attempts(engine, run_id="r1")
    assert [(r["case_key"], r["attempt"], r["current"], r["driver_version"], r["host_driver_version"])
            for r in every] == [("a", 1, False, DRIVER_A, None), ("a", 2, True, DRIVER_B, DRIVER_B),
                                ("b", 1, False, DRIVER_A, None), ("b", 2, True, DRIVER_B, DRIVER_B)]
    # The next rerun, with a new check: attempt 3; B's attempt and its check are kept.
    store_run(engine, run_row(), [host_check(DRIVER_B, "2026-12-03T02:00:00+00:00")], night("C", DRIVER_B, 300.0))
    assert count(engine, superseded_host_facts) == 1
    b_attempt = [r for r in fetch_attempts(engine, run_id="r1") if (r["case_key"], r["attempt"]) == ("a", 2)]
    assert [r["host_checked_at"] for r in b_attempt] == ["2026-12-02T02:00:00+00:00"]
    downgrade(engine, "0014")
    assert "superseded_host_facts" not in inspect(engine).get_table_names()
    assert "host_collected_at" not in {c["name"] for c in inspect(engine).get_columns("superseded_results")}
    assert count(engine, superseded_results) == 4 and count(engine, benchmark_results) == 2
    upgrade(engine)
    assert current_revision(engine) == HEAD and count(engine, superseded_results) == 4


def utc_of(value):
    from fleetbench.timestamps import utc

    return utc(value)
