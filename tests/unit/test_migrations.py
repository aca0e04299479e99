"""Alembic migrations on SQLite: from an empty database, from the previous revision with rows, down and up again."""

from __future__ import annotations

import shutil

from fleetbench.warehouse import MIGRATIONS, get_engine
from warehouse_contract import (
    HEAD,
    check_failed_migration_rolls_back,
    check_migrate_cpu_cases_out_of_gpu_rollups,
    check_migrate_cpu_energy_columns,
    check_migrate_empty_database,
    check_migrate_from_previous_revision,
    check_migrate_mig_columns,
    check_migrate_to_capacity,
)


def engine_at(tmp_path):
    return get_engine(f"sqlite:///{tmp_path}/w.db")


def test_migrate_empty_database(tmp_path):
    check_migrate_empty_database(engine_at(tmp_path))


def test_migrate_from_previous_revision_keeps_rows_and_downgrades(tmp_path):
    check_migrate_from_previous_revision(engine_at(tmp_path))


def test_migrate_cpu_energy_columns(tmp_path):
    check_migrate_cpu_energy_columns(engine_at(tmp_path))


def test_failed_migration_rolls_back(tmp_path):
    check_failed_migration_rolls_back(engine_at(tmp_path))


def test_later_batch_alter_keeps_the_view_and_the_rollups(tmp_path):
    """A later revision that rebuilds benchmark_results (SQLite batch mode) works with capacity_features and
    the rollups in place, and store_run keeps the rollups in step afterwards."""
    from alembic import command
    from sqlalchemy import inspect
    from test_warehouse_rollups import check_rollups_match_results, nightly, run_of

    from fleetbench.warehouse import current_revision, fetch_capacity_features, store_run, upgrade
    from fleetbench.warehouse.engine import _alembic
    from warehouse_rows import result_row, run_row

    engine = engine_at(tmp_path)
    scripts = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "0099_rebuild.py").write_text(
        'import sqlalchemy as sa\nfrom alembic import op\n\nrevision = "0099"\n'
        f'down_revision = "{HEAD}"\nbranch_labels = None\ndepends_on = None\n\n\ndef upgrade():\n'
        '    with op.batch_alter_table("benchmark_results", recreate="always") as batch:\n'
        '        batch.add_column(sa.Column("later_metric", sa.Float))\n\n\ndef downgrade():\n'
        '    with op.batch_alter_table("benchmark_results", recreate="always") as batch:\n'
        '        batch.drop_column("later_metric")\n')
    upgrade(engine)
    store_run(engine, run_row("r1"), [], [result_row("a")])
    _alembic(engine, command.upgrade, "0099", scripts)
    assert current_revision(engine) == "0099"
    assert [r["case_key"] for r in fetch_capacity_features(engine)] == ["a"]
    assert "later_metric" in {c["name"] for c in inspect(engine).get_columns("benchmark_results")}
    assert ("ix_benchmark_results_host_case_date"
            in {i["name"] for i in inspect(engine).get_indexes("benchmark_results")})
    rows = nightly(3)
    store_run(engine, run_of(rows), [], rows)
    check_rollups_match_results(engine)
    _alembic(engine, command.downgrade, HEAD, scripts)
    assert "a" in {r["case_key"] for r in fetch_capacity_features(engine)}
    assert "later_metric" not in {c["name"] for c in inspect(engine).get_columns("benchmark_results")}
    check_rollups_match_results(engine)


def test_db_upgrade_cli(tmp_path, monkeypatch):
    from fleetbench.cli import main
    from fleetbench.warehouse import current_revision

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/cli.db")
    assert main(["db", "upgrade"]) == 0
    assert current_revision(get_engine(f"sqlite:///{tmp_path}/cli.db")) == HEAD


def test_schema_module_and_migrations_agree_on_the_rollups(tmp_path):
    from sqlalchemy import inspect

    from fleetbench.warehouse import upgrade
    from fleetbench.warehouse.schema import ROLLUPS

    engine = engine_at(tmp_path)
    upgrade(engine)
    insp = inspect(engine)
    for table in ROLLUPS:
        columns = {c["name"]: c["nullable"] for c in insp.get_columns(table.name)}
        assert columns == {c.name: c.nullable for c in table.columns}, table.name
        assert {i["name"] for i in insp.get_indexes(table.name)} == {i.name for i in table.indexes}, table.name


def test_migrate_to_capacity_keeps_rows_and_downgrades(tmp_path):
    check_migrate_to_capacity(engine_at(tmp_path))


def test_migrate_filled_warehouse_to_metric_samples(tmp_path):
    from warehouse_contract import check_migrate_filled_warehouse_to_metrics

    check_migrate_filled_warehouse_to_metrics(engine_at(tmp_path))


def test_migrate_mig_columns_keeps_rows_and_downgrades(tmp_path):
    check_migrate_mig_columns(engine_at(tmp_path))


def test_migrate_regression_units_and_wide_metric_names(tmp_path):
    from warehouse_contract import check_migrate_regression_units

    check_migrate_regression_units(engine_at(tmp_path))


def test_migrate_to_multinode_keeps_rows_and_downgrades(tmp_path):
    from warehouse_contract import check_migrate_to_multinode

    check_migrate_to_multinode(engine_at(tmp_path))


def test_migrate_cpu_cases_out_of_gpu_rollups(tmp_path):
    check_migrate_cpu_cases_out_of_gpu_rollups(engine_at(tmp_path))


def test_migrate_torch_precision(tmp_path):
    from warehouse_contract import check_migrate_torch_precision

    check_migrate_torch_precision(engine_at(tmp_path))


def test_migrate_regression_mailed_at(tmp_path):
    from warehouse_contract import check_migrate_regression_mailed_at

    check_migrate_regression_mailed_at(engine_at(tmp_path))


def test_migrate_month_model_runs(tmp_path):
    from warehouse_contract import check_migrate_month_model_runs

    check_migrate_month_model_runs(engine_at(tmp_path))


def test_migrate_case_rollup_variant(tmp_path):
    from warehouse_contract import check_migrate_case_rollup_variant

    check_migrate_case_rollup_variant(engine_at(tmp_path))


def test_migrate_whole_gpu_scaled_mask(tmp_path):
    from warehouse_contract import check_migrate_whole_gpu_scaled_mask

    check_migrate_whole_gpu_scaled_mask(engine_at(tmp_path))


def test_migrate_bake_provenance(tmp_path):
    from warehouse_contract import check_migrate_bake_provenance

    check_migrate_bake_provenance(engine_at(tmp_path))


def test_repair_oom_indexes(tmp_path):
    from warehouse_contract import check_repair_oom_indexes

    check_repair_oom_indexes(engine_at(tmp_path))


def test_a_warehouse_stamped_0015_with_0012s_schema_upgrades_through_0013_to_0015(tmp_path):
    """For a few seconds of main's history (03d4d10) the MIG columns' revision was numbered 0015 (now 0012): a
    warehouse it migrated is stamped 0015 with 0012's schema, and an upgrade went on at 0016, which failed on the
    missing `nodes` column, every night. It is re-stamped 0012 and upgraded through 0013-0015, rows kept."""
    from sqlalchemy import inspect, text

    from fleetbench.warehouse import current_revision, fetch_results, store_run, upgrade
    from warehouse_rows import result_row, run_row

    engine = engine_at(tmp_path)
    upgrade(engine, "0012")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO benchmark_results (dag_id, run_id, host, case_key, status, mig_profile, "
                          "mig_instances) VALUES ('fleet_benchmark', 'r0', 'h1', 'mig.case', 'ok', '1g.10gb', 7)"))
        conn.execute(text("UPDATE alembic_version SET version_num = '0015'"))
    upgrade(engine)
    assert current_revision(engine) == HEAD
    assert "superseded_host_facts" in inspect(engine).get_table_names()
    [row] = fetch_results(engine)
    assert (row["case_key"], row["mig_profile"], row["mig_instances"], row["nodes"]) == ("mig.case", "1g.10gb", 7, 1)
    store_run(engine, run_row("r1"), [], [result_row("later")])  # and the DAG stores on it
    assert len(fetch_results(engine)) == 2
    upgrade(engine)  # a true 0015 (superseded_host_facts there) is never re-stamped: head stays head
    assert current_revision(engine) == HEAD
    engine.dispose()
