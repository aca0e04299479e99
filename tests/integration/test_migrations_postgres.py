"""Alembic migrations on a real PostgreSQL server: a fresh database per test."""

from __future__ import annotations

import pytest

from warehouse_contract import (
    check_failed_migration_rolls_back,
    check_migrate_cpu_cases_out_of_gpu_rollups,
    check_migrate_cpu_energy_columns,
    check_migrate_empty_database,
    check_migrate_from_previous_revision,
    check_migrate_mig_columns,
    check_migrate_to_capacity,
)

pytestmark = pytest.mark.integration


def test_migrate_empty_database(pg_engine):
    check_migrate_empty_database(pg_engine)


def test_migrate_from_previous_revision_keeps_rows_and_downgrades(pg_engine):
    check_migrate_from_previous_revision(pg_engine)


def test_migrate_cpu_energy_columns(pg_engine):
    check_migrate_cpu_energy_columns(pg_engine)


def test_failed_migration_rolls_back(pg_engine):
    check_failed_migration_rolls_back(pg_engine)


def test_migrate_to_capacity_keeps_rows_and_downgrades(pg_engine):
    check_migrate_to_capacity(pg_engine)


def test_migrate_filled_warehouse_to_metric_samples(pg_engine):
    from warehouse_contract import check_migrate_filled_warehouse_to_metrics

    check_migrate_filled_warehouse_to_metrics(pg_engine)


def test_migrate_mig_columns_keeps_rows_and_downgrades(pg_engine):
    check_migrate_mig_columns(pg_engine)


def test_migrate_regression_units_and_wide_metric_names(pg_engine):
    from warehouse_contract import check_migrate_regression_units

    check_migrate_regression_units(pg_engine)


def test_migrate_to_multinode_keeps_rows_and_downgrades(pg_engine):
    from warehouse_contract import check_migrate_to_multinode

    check_migrate_to_multinode(pg_engine)


def test_migrate_cpu_cases_out_of_gpu_rollups(pg_engine):
    check_migrate_cpu_cases_out_of_gpu_rollups(pg_engine)


def test_migrate_torch_precision(pg_engine):
    from warehouse_contract import check_migrate_torch_precision

    check_migrate_torch_precision(pg_engine)


def test_migrate_regression_mailed_at(pg_engine):
    from warehouse_contract import check_migrate_regression_mailed_at

    check_migrate_regression_mailed_at(pg_engine)


def test_migrate_month_model_runs(pg_engine):
    from warehouse_contract import check_migrate_month_model_runs

    check_migrate_month_model_runs(pg_engine)


def test_migrate_case_rollup_variant(pg_engine):
    from warehouse_contract import check_migrate_case_rollup_variant

    check_migrate_case_rollup_variant(pg_engine)


def test_migrate_whole_gpu_scaled_mask(pg_engine):
    from warehouse_contract import check_migrate_whole_gpu_scaled_mask

    check_migrate_whole_gpu_scaled_mask(pg_engine)


def test_migrate_bake_provenance(pg_engine):
    from warehouse_contract import check_migrate_bake_provenance

    check_migrate_bake_provenance(pg_engine)


def test_repair_oom_indexes(pg_engine):
    from warehouse_contract import check_repair_oom_indexes

    check_repair_oom_indexes(pg_engine)
