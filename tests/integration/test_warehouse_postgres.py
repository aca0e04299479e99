"""Warehouse writes on a real PostgreSQL server on 127.0.0.1:5432."""

from __future__ import annotations

import pytest

from warehouse_contract import (
    check_capacity_features,
    check_capacity_reads_profiles_bounds_and_misses,
    check_concurrent_writers,
    check_failed_write_leaves_nothing,
    check_regressions_table,
    check_report_reads_through_partial_indexes,
    check_rerun_with_fewer_cases_leaves_no_stale_rows,
    check_run_counts_are_what_was_stored,
    check_store_and_rerun_replaces,
    check_timestamps_read_back_in_utc,
)

pytestmark = pytest.mark.integration


def test_store_and_rerun_replaces(pg_engine):
    check_store_and_rerun_replaces(pg_engine)


def test_delete_keys_in_chunks_removes_exactly_those_keys(pg_engine):
    """Large nights delete stale rows in chunks (one IN list of 20,000 keys overflows PostgreSQL's parser)."""
    from warehouse_contract import check_delete_keys_removes_exactly_those_keys

    check_delete_keys_removes_exactly_those_keys(pg_engine, chunk=3)


def test_failed_write_leaves_nothing(pg_engine):
    check_failed_write_leaves_nothing(pg_engine)


def test_run_counts_are_what_was_stored(pg_engine):
    check_run_counts_are_what_was_stored(pg_engine)


def test_timestamps_read_back_in_utc(pg_engine):
    check_timestamps_read_back_in_utc(pg_engine)


def test_capacity_features_view(pg_engine):
    check_capacity_features(pg_engine)


def test_capacity_reads_profiles_bounds_and_misses(pg_engine):
    check_capacity_reads_profiles_bounds_and_misses(pg_engine)


def test_report_reads_through_partial_indexes(pg_engine):
    check_report_reads_through_partial_indexes(pg_engine)


def test_regressions_table(pg_engine):
    check_regressions_table(pg_engine)


def test_two_processes_writing_overlapping_keys_leave_one_row_per_key(pg_database):
    """Two writer processes migrate a fresh database at once, then upsert 45 keys each (30 shared) into
    the same run, ten rounds: no write fails, one row per key, each case's steps from one writer."""
    check_concurrent_writers(pg_database, rounds=10)


def test_rerun_with_fewer_cases_leaves_no_stale_rows(pg_engine):
    check_rerun_with_fewer_cases_leaves_no_stale_rows(pg_engine)


def test_metric_samples_stored_with_results(pg_engine):
    from warehouse_contract import check_metric_samples_stored_with_results

    check_metric_samples_stored_with_results(pg_engine)


def test_samples_of_results_written_earlier_are_upserted(pg_engine):
    from warehouse_contract import check_samples_of_results_written_earlier_are_upserted

    check_samples_of_results_written_earlier_are_upserted(pg_engine)


def test_results_are_read_in_batches_through_a_server_side_cursor(pg_engine):
    """`iter_results` (the `results --all` export) reads PostgreSQL through a named cursor, `batch` rows at a time,
    and gives the rows `fetch_results` gives, in its order."""
    from sqlalchemy import event

    from fleetbench.warehouse import fetch_results, store_run, upgrade
    from fleetbench.warehouse.read import iter_results
    from warehouse_rows import result_row, run_row

    upgrade(pg_engine)
    for night in ("n1", "n2"):
        store_run(pg_engine, run_row(night), [], [result_row(f"c{k}", run_id=night, host=f"h{k % 3}")
                                                  for k in range(7)])
    named = []

    def note(conn, cursor, statement, *args):
        named.append(getattr(cursor, "name", None))

    event.listen(pg_engine, "before_cursor_execute", note)
    try:
        streamed = list(iter_results(pg_engine, batch=3))
    finally:
        event.remove(pg_engine, "before_cursor_execute", note)
    assert any(named), named  # psycopg2's server-side cursors are the named ones
    assert streamed == fetch_results(pg_engine) and len(streamed) == 14
    assert [r["run_id"] for r in streamed] == ["n1"] * 7 + ["n2"] * 7  # one night: by run id, then host and case
    # --host: its own rows and the sets it was in, exactly (case and LIKE's wildcards count), as on SQLite
    store_run(pg_engine, run_row("n3"), [], [result_row("two", run_id="n3", host="h_1", nodes=2, host_set="h_1,Gpu%2"),
                                             result_row("one", run_id="n3", host="h1")])
    assert [(r["host"], r["case_key"]) for r in iter_results(pg_engine, run_id="n3", host="Gpu%2")] == [("h_1", "two")]
    assert list(iter_results(pg_engine, run_id="n3", host="gpu%2")) == []
    assert [r["case_key"] for r in iter_results(pg_engine, run_id="n3", host="h1")] == ["one"]
