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
    check_store_and_rerun_replaces,
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


def test_capacity_features_view(tmp_path):
    check_capacity_features(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_capacity_reads_profiles_bounds_and_misses(tmp_path):
    check_capacity_reads_profiles_bounds_and_misses(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_report_reads_through_partial_indexes(tmp_path):
    check_report_reads_through_partial_indexes(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_regressions_table(tmp_path):
    check_regressions_table(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_rewrites_in_chunks_replace_all_their_steps(tmp_path, monkeypatch):
    """Large nights delete stale steps in chunks (one IN list of 20,000 keys overflows PostgreSQL's parser)."""
    import fleetbench.warehouse.bulk as bulk

    monkeypatch.setattr(bulk, "DELETE_CHUNK", 1)
    check_store_and_rerun_replaces(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_rerun_with_fewer_cases_leaves_no_stale_rows(tmp_path):
    check_rerun_with_fewer_cases_leaves_no_stale_rows(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_metric_samples_stored_with_results(tmp_path):
    from warehouse_contract import check_metric_samples_stored_with_results

    check_metric_samples_stored_with_results(get_engine(f"sqlite:///{tmp_path}/w.db"))


def test_samples_of_results_written_earlier_are_upserted(tmp_path):
    from warehouse_contract import check_samples_of_results_written_earlier_are_upserted

    check_samples_of_results_written_earlier_are_upserted(get_engine(f"sqlite:///{tmp_path}/w.db"))
