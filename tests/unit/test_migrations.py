"""Alembic migrations on SQLite: from an empty database, from the previous revision with rows, down and up again."""

from __future__ import annotations

from fleetbench.warehouse import get_engine
from warehouse_contract import (check_failed_migration_rolls_back, check_later_batch_alter_keeps_the_view,
                                check_migrate_empty_database, check_migrate_from_previous_revision)


def engine_at(tmp_path):
    return get_engine(f"sqlite:///{tmp_path}/w.db")


def test_migrate_empty_database(tmp_path):
    check_migrate_empty_database(engine_at(tmp_path))


def test_migrate_from_previous_revision_keeps_rows_and_downgrades(tmp_path):
    check_migrate_from_previous_revision(engine_at(tmp_path))


def test_failed_migration_rolls_back(tmp_path):
    check_failed_migration_rolls_back(engine_at(tmp_path))


def test_later_batch_alter_keeps_the_view(tmp_path):
    check_later_batch_alter_keeps_the_view(engine_at(tmp_path), tmp_path)


def test_db_upgrade_cli(tmp_path, monkeypatch):
    from fleetbench.cli import main
    from fleetbench.warehouse import current_revision

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/cli.db")
    assert main(["db", "upgrade"]) == 0
    assert current_revision(get_engine(f"sqlite:///{tmp_path}/cli.db")) == "0003"
