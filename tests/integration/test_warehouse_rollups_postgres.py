"""The warehouse's rollups on a real PostgreSQL server: the checks of tests/unit/test_warehouse_rollups.py,
values SQLite cannot hold (NaN, infinities), and concurrent writers of different runs of one month."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from test_warehouse_rollups import (  # noqa: E402
    check_driver_changes_back_and_forth,
    check_failed_write_leaves_rollups_alone,
    check_fleet_throughput,
    check_migration_backfills_rollups,
    check_model_runs_count_each_run_once,
    check_report_windows_across_months,
    check_rerun_moving_a_run_to_another_month,
    check_rollups_match_results,
    check_store_rerun_and_upsert_keep_rollups_equal,
    nightly,
    run_of,
)

pytestmark = pytest.mark.integration


def test_a_hosts_newest_check_is_the_one_collected_last(pg_engine):
    from test_report import check_newest_check_is_the_one_collected_last

    check_newest_check_is_the_one_collected_last(pg_engine)


def test_store_rerun_and_upsert_keep_rollups_equal(pg_engine):
    check_store_rerun_and_upsert_keep_rollups_equal(pg_engine)


def test_rerun_moving_a_run_to_another_month(pg_engine):
    check_rerun_moving_a_run_to_another_month(pg_engine)


def test_failed_write_leaves_rollups_alone(pg_engine):
    check_failed_write_leaves_rollups_alone(pg_engine)


def test_model_runs_count_each_run_once(pg_engine):
    check_model_runs_count_each_run_once(pg_engine)


def test_migration_backfills_rollups(pg_engine):
    check_migration_backfills_rollups(pg_engine)


def test_report_windows_across_months(pg_engine):
    check_report_windows_across_months(pg_engine)


def test_driver_changes_back_and_forth(pg_engine):
    check_driver_changes_back_and_forth(pg_engine)


def test_fleet_throughput(pg_engine):
    check_fleet_throughput(pg_engine)


def test_nan_and_infinite_throughput_are_not_points(pg_engine):
    """PostgreSQL floats hold NaN and infinities: the fleet's median, min and max leave them out, as the
    per-host series do."""
    from fleetbench.report import build_report, parse_filters
    from fleetbench.warehouse import store_run, upgrade

    upgrade(pg_engine)
    rows = nightly(0)
    odd = [r for r in rows if r["case_key"] == "tf.resnet50.bs64.g1.replicated"]
    for row, value in zip(odd, (float("nan"), float("inf"))):
        row.update(images_per_sec=value, images_per_joule=None, cost_per_million_images_usd=None)
    store_run(pg_engine, run_of(rows), [], rows)
    check_rollups_match_results(pg_engine)
    report = build_report(pg_engine, parse_filters(since="2026-01-01"), max_series=1)
    [series] = [s for s in report["throughput"] if s["case_key"] == "tf.resnet50.bs64.g1.replicated"]
    assert [(p["hosts"], p["images_per_sec"], p["min"], p["max"]) for p in series["points"]] == [
        (1, odd[2]["images_per_sec"], odd[2]["images_per_sec"], odd[2]["images_per_sec"])]


def _writer(url: str, day: int, barrier) -> None:
    from fleetbench.warehouse import get_engine, store_run

    engine = get_engine(url)
    try:
        rows = nightly(day)
        barrier.wait(timeout=60)
        for _ in range(3):
            store_run(engine, run_of(rows), [], rows)
    finally:
        engine.dispose()


def test_concurrent_runs_of_one_month_leave_one_month_rollup(pg_database):
    """Two processes store different nights of the same month at once (a backfill with parallel runs):
    each month row is written once, from both nights."""
    import multiprocessing

    from fleetbench.warehouse import get_engine, upgrade

    engine = get_engine(pg_database)
    try:
        upgrade(engine)
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(2)
        procs = [ctx.Process(target=_writer, args=(pg_database, day, barrier)) for day in (4, 5)]  # 2 and 3 February
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0, 0]
        check_rollups_match_results(engine)
    finally:
        engine.dispose()
