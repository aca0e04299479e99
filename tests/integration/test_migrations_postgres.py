"""Alembic migrations on a real PostgreSQL server: a fresh database per test."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text

from fleetbench.warehouse import get_engine
from warehouse_contract import (check_failed_migration_rolls_back, check_migrate_empty_database,
                                check_migrate_from_previous_revision)

pytestmark = pytest.mark.integration


@pytest.fixture()
def pg_engine(pg_url):
    name = f"fb_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = get_engine(pg_url.rsplit("/", 1)[0] + "/" + name)
    yield engine
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_migrate_empty_database(pg_engine):
    check_migrate_empty_database(pg_engine)


def test_migrate_from_previous_revision_keeps_rows_and_downgrades(pg_engine):
    check_migrate_from_previous_revision(pg_engine)


def test_failed_migration_rolls_back(pg_engine):
    check_failed_migration_rolls_back(pg_engine)
