"""Warehouse writes on SQLite (the default): idempotent, atomic, migrated by Alembic."""

from __future__ import annotations

from sqlalchemy import inspect

from fleetbench.warehouse import get_engine, upgrade, warehouse_url
from warehouse_contract import (
    check_capacity_features,
    check_capacity_reads_profiles_bounds_and_misses,
    check_failed_write_leaves_nothing,
    check_regressions_table,
    check_report_reads_through_partial_indexes,
    check_rerun_with_fewer_cases_leaves_no_stale_rows,
    check_run_counts_are_what_was_stored,
    check_store_and_rerun_replaces,
    check_timestamps_read_back_in_utc,
)


def test_default_url_is_sqlite_in_data_dir(data_dir):
    import os

    os.environ.pop("FLEETBENCH_WAREHOUSE_URL")
    assert warehouse_url() == f"sqlite:///{data_dir}/warehouse.db"


def test_migration_creates_tables_and_indexes(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    insp = inspect(engine)
    assert ({"runs", "host_facts", "benchmark_results", "steps", "regressions", "alembic_version"}
            <= set(insp.get_table_names()))
    assert {"ix_benchmark_results_host_case_time", "ix_benchmark_results_logical_date",
            "ix_benchmark_results_case_time"} <= {i["name"] for i in insp.get_indexes("benchmark_results")}


def test_store_and_rerun_replaces(tmp_path):
    check_store_and_rerun_replaces(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_failed_write_leaves_nothing(tmp_path):
    check_failed_write_leaves_nothing(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_run_counts_are_what_was_stored(tmp_path):
    check_run_counts_are_what_was_stored(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_timestamps_read_back_in_utc(tmp_path):
    check_timestamps_read_back_in_utc(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_capacity_features_view(tmp_path):
    check_capacity_features(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_capacity_reads_profiles_bounds_and_misses(tmp_path):
    check_capacity_reads_profiles_bounds_and_misses(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_report_reads_through_partial_indexes(tmp_path):
    check_report_reads_through_partial_indexes(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_regressions_table(tmp_path):
    check_regressions_table(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_delete_keys_removes_exactly_those_keys(tmp_path):
    from warehouse_contract import check_delete_keys_removes_exactly_those_keys

    check_delete_keys_removes_exactly_those_keys(get_engine(f"sqlite:///{tmp_path}/w.db"), chunk=2)


def test_every_delete_of_a_store_searches_an_index(tmp_path):
    """Each DELETE a store runs on SQLite (a case's steps and metric samples before they are written again,
    superseded results, dropped host checks) finds its rows through an index on the key. A row-value
    `(..) IN (VALUES ..)` was planned as a scan of the whole table: on a year of history (36 million metric
    samples) one night's store took 257 s instead of ~3 s."""
    from fleetbench.warehouse import bulk
    from fleetbench.warehouse.schema import (
        HOST_KEY,
        RESULT_KEY,
        benchmark_results,
        host_facts,
        result_metrics,
        steps,
    )

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    with engine.connect() as conn:
        for table, key in ((steps, RESULT_KEY), (result_metrics, RESULT_KEY), (benchmark_results, RESULT_KEY),
                           (host_facts, HOST_KEY)):
            plan = "; ".join(r[-1] for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + bulk.sqlite_delete(table, key), (None,) * len(key)).all())
            assert plan.startswith(f"SEARCH {table.name} USING INDEX") and "SCAN" not in plan, (table.name, plan)
        # what the old statement (two keys or more) was planned as, so this test knows a scan when it sees one
        scan = conn.exec_driver_sql("EXPLAIN QUERY PLAN DELETE FROM steps WHERE (dag_id, run_id, host, case_key) "
                                    "IN (VALUES (?, ?, ?, ?), (?, ?, ?, ?))", tuple("drhc" * 2)).all()
        assert any(r[-1].startswith("SCAN steps") for r in scan), scan


def test_rerun_with_fewer_cases_leaves_no_stale_rows(tmp_path):
    check_rerun_with_fewer_cases_leaves_no_stale_rows(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_metric_samples_stored_with_results(tmp_path):
    from warehouse_contract import check_metric_samples_stored_with_results

    check_metric_samples_stored_with_results(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_samples_of_results_written_earlier_are_upserted(tmp_path):
    from warehouse_contract import check_samples_of_results_written_earlier_are_upserted

    check_samples_of_results_written_earlier_are_upserted(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_postgresql_sessions_are_in_utc_after_the_options_given(monkeypatch):
    """PostgreSQL engines start their sessions in UTC (timestamptz comes back in the session's zone), after the
    startup options the URL gives, else PGOPTIONS (libpq reads PGOPTIONS only without an `options` parameter)."""
    from fleetbench.warehouse.engine import _utc_options

    monkeypatch.delenv("PGOPTIONS", raising=False)
    assert _utc_options("postgresql+psycopg2://u@db/w") == "-c TimeZone=UTC"
    assert (_utc_options("postgresql+psycopg2://u@db/w?options=-c%20statement_timeout%3D5s")
            == "-c statement_timeout=5s -c TimeZone=UTC")
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=5MB")
    assert _utc_options("postgresql+psycopg2://u@db/w") == "-c work_mem=5MB -c TimeZone=UTC"
