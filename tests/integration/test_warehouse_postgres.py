"""Warehouse writes on a real PostgreSQL server on 127.0.0.1:5432."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text

from fleetbench.warehouse import get_engine
from warehouse_contract import check_failed_write_leaves_nothing, check_store_and_rerun_replaces

pytestmark = pytest.mark.integration


@pytest.fixture()
def pg_engine(pg_url):
    """A fresh database per test, dropped afterwards."""
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


def test_store_and_rerun_replaces(pg_engine):
    check_store_and_rerun_replaces(pg_engine)


def test_failed_write_leaves_nothing(pg_engine):
    check_failed_write_leaves_nothing(pg_engine)
