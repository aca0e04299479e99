"""Attempts on a real PostgreSQL server on 127.0.0.1:5432 (the same checks as tests/unit/test_attempts.py)."""

from __future__ import annotations

import pytest

from attempts_contract import (
    check_failed_rerun_keeps_the_previous_attempt,
    check_migration_keeps_superseded_attempts_without_a_host_check,
    check_migration_makes_stored_rows_attempt_1,
    check_rerun_adds_attempts_and_a_retry_replaces,
    check_superseded_attempts_keep_their_host_check,
)

pytestmark = pytest.mark.integration


def test_rerun_adds_attempts_and_a_retry_replaces(pg_engine):
    check_rerun_adds_attempts_and_a_retry_replaces(pg_engine)


def test_failed_rerun_keeps_the_previous_attempt(pg_engine, monkeypatch):
    check_failed_rerun_keeps_the_previous_attempt(pg_engine, monkeypatch)


def test_migration_makes_stored_rows_attempt_1(pg_engine):
    check_migration_makes_stored_rows_attempt_1(pg_engine)


def test_superseded_attempts_keep_their_host_check(pg_engine):
    check_superseded_attempts_keep_their_host_check(pg_engine)


def test_migration_keeps_superseded_attempts_without_a_host_check(pg_engine):
    check_migration_keeps_superseded_attempts_without_a_host_check(pg_engine)
