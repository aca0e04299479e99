"""The warehouse: SQLite by default (`.data/warehouse.db`), PostgreSQL in production.

`FLEETBENCH_WAREHOUSE_URL` picks the database. Writes are idempotent and atomic: one run's rows
are upserted in one transaction keyed by (dag_id, run_id, host, case_key), so a retry or rerun
replaces its own rows and a failure mid-write leaves nothing partial. Writers that race on the same
keys (a task retried while its first try still writes) serialise on the run's row; rows are written
in key order, and a transaction the database aborts to break a deadlock is retried whole.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, and_, create_engine, delete, event, select, text, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from fleetbench.paths import data_dir
from fleetbench.warehouse.schema import (CAPACITY_FEATURES_VIEW, HOST_KEY, RESULT_COLUMNS, RESULT_KEY, RUN_KEY, STEP_KEY,
                                         benchmark_results, host_facts, runs, steps)

log = logging.getLogger(__name__)

DELETE_CHUNK = 1000  # keys per DELETE ... WHERE (..) IN (..) statement
MIGRATIONS = Path(__file__).parent / "migrations"
# pg_advisory_xact_lock key that serialises concurrent `upgrade` calls on one PostgreSQL database.
_MIGRATION_LOCK = 0x66_6C_65_65_74  # "fleet"
# SQLSTATEs of transactions PostgreSQL aborted to break a deadlock or a serialisation conflict.
_RETRY_SQLSTATES = {"40P01", "40001"}
WRITE_ATTEMPTS = 4


def warehouse_url() -> str:
    url = os.environ.get("FLEETBENCH_WAREHOUSE_URL")
    if url:
        return url
    path = data_dir() / "warehouse.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


class WarehouseURLError(ValueError):
    """FLEETBENCH_WAREHOUSE_URL (or a given URL) is not a database fleetbench can open."""


def warehouse_display_url(url: str | None = None) -> str:
    """The warehouse URL for messages and logs: the password is never shown."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url or warehouse_url()).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable URL>"


def _normalise(url: str) -> str:
    """A plain `postgresql://` URL uses psycopg2 (what requirements.txt installs)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise WarehouseURLError(f"FLEETBENCH_WAREHOUSE_URL: not a database URL: {warehouse_display_url(url)} "
                                "(e.g. sqlite:////path/warehouse.db or postgresql://user:password@host/db)") from None
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise WarehouseURLError(f"FLEETBENCH_WAREHOUSE_URL: {parsed.get_backend_name()} is not supported "
                                "(SQLite or PostgreSQL)")
    return parsed.render_as_string(hide_password=False)


def get_engine(url: str | None = None) -> Engine:
    url = _normalise(url or warehouse_url())
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # WAL: readers don't block the writer
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    try:
        return create_engine(url, pool_pre_ping=True)
    except ImportError as exc:
        raise WarehouseURLError(f"FLEETBENCH_WAREHOUSE_URL {warehouse_display_url(url)}: driver not installed ({exc})") from None


def _alembic(engine: Engine, action, revision: str, script_location: Path = MIGRATIONS) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # two first writers at once: the second waits, then finds head
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        elif conn.dialect.name == "sqlite":
            # pysqlite opens a transaction only before INSERT/UPDATE/DELETE, so DDL would autocommit
            # statement by statement; an explicit one makes a migration all or nothing. IMMEDIATE:
            # the write lock up front, so two first writers take turns instead of failing.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        cfg.attributes["connection"] = conn
        action(cfg, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply Alembic migrations (`fleetbench db upgrade`); the DAG calls this before its first write.

    One transaction (PostgreSQL and SQLite both have transactional DDL): a failed migration leaves
    the previous revision. Concurrent callers on PostgreSQL take turns.
    """
    _alembic(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Revert migrations down to `revision` ("base" removes everything)."""
    _alembic(engine, command.downgrade, revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _dt(value: Any) -> datetime | None:
    """ISO text or datetime -> an aware UTC datetime (naive values are taken as UTC)."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _upsert(conn, table, rows: list[dict], key: tuple[str, ...]) -> None:
    if not rows:
        return
    dialect = conn.dialect.name
    insert = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}.get(dialect)
    if insert is None:  # other databases: delete then insert, still inside the caller's transaction
        keys = [tuple(r[k] for k in key) for r in rows]
        for i in range(0, len(keys), DELETE_CHUNK):
            conn.execute(delete(table).where(tuple_(*[table.c[k] for k in key]).in_(keys[i:i + DELETE_CHUNK])))
        conn.execute(table.insert(), rows)
        return
    stmt = insert(table)
    updates = {c: stmt.excluded[c] for c in rows[0] if c not in key}
    stmt = stmt.on_conflict_do_update(index_elements=list(key), set_=updates) if updates else stmt.on_conflict_do_nothing()
    conn.execute(stmt, rows)


def store_run(engine: Engine, run: dict, hosts: Iterable[dict], results: Iterable[dict], step_rows: Iterable[dict] = ()) -> int:
    """Upsert one run's rows in one transaction; returns the number of result rows written."""
    now = datetime.now(timezone.utc)
    run_row = {**run, "logical_date": _dt(run.get("logical_date")), "started_at": _dt(run.get("started_at")),
               "finished_at": _dt(run.get("finished_at"))}
    host_rows = [{**h, "collected_at": _dt(h.get("collected_at"))} for h in hosts]
    result_rows = []
    for r in results:
        row = {c: r.get(c) for c in RESULT_COLUMNS}
        for c in ("logical_date", "started_at", "finished_at"):
            row[c] = _dt(row[c])
        if isinstance(row["command"], (list, tuple)):
            row["command"] = json.dumps(row["command"])
        row["stored_at"] = now
        result_rows.append(row)
    # Key order everywhere: two writers of overlapping keys lock rows in the same order.
    host_rows.sort(key=lambda r: _key(r, HOST_KEY))
    result_rows.sort(key=lambda r: _key(r, RESULT_KEY))
    step_rows = sorted(step_rows, key=lambda r: _key(r, STEP_KEY))
    keys = sorted({tuple(r[k] for k in RESULT_KEY) for r in result_rows}, key=lambda k: tuple(map(str, k)))
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                # The run's row first: concurrent writers of one run queue here, so each case's
                # result and steps end up from one writer.
                _upsert(conn, runs, [run_row], RUN_KEY)
                _upsert(conn, host_facts, host_rows, HOST_KEY)
                _upsert(conn, benchmark_results, result_rows, RESULT_KEY)
                # Steps of the cases written now are replaced as a whole: stale steps from an earlier try go.
                # In chunks: one IN list of 20,000 row-value tuples overflows PostgreSQL's parser stack.
                for i in range(0, len(keys), DELETE_CHUNK):
                    conn.execute(delete(steps).where(tuple_(*[steps.c[k] for k in RESULT_KEY]).in_(keys[i:i + DELETE_CHUNK])))
                _upsert(conn, steps, step_rows, STEP_KEY)
            return len(result_rows)
        except DBAPIError as exc:
            if attempt == WRITE_ATTEMPTS or not _retryable(exc):
                raise
            log.warning("warehouse write of run %s aborted (%s), retrying (%d/%d)", run_row.get("run_id"),
                        str(exc.orig).splitlines()[0] if exc.orig else exc, attempt, WRITE_ATTEMPTS - 1)
            time.sleep(0.05 * 2 ** attempt)
    raise AssertionError("unreachable")


def _key(row: dict, key: tuple[str, ...]) -> tuple:
    return tuple("" if row.get(k) is None else str(row.get(k)) for k in key)


def _retryable(exc: DBAPIError) -> bool:
    """A deadlock or serialisation abort (PostgreSQL), or a SQLite writer that found the database locked."""
    if getattr(exc.orig, "pgcode", None) in _RETRY_SQLSTATES:
        return True
    return "database is locked" in str(exc.orig or "")


def fetch_results(engine: Engine, run_id: str | None = None, dag_id: str | None = None) -> list[dict]:
    """Result rows (newest run first, then host and case), as plain dicts with ISO timestamps."""
    query = select(benchmark_results)
    conds = []
    if run_id:
        conds.append(benchmark_results.c.run_id == run_id)
    if dag_id:
        conds.append(benchmark_results.c.dag_id == dag_id)
    if conds:
        query = query.where(and_(*conds))
    query = query.order_by(benchmark_results.c.logical_date.desc(), benchmark_results.c.run_id,
                           benchmark_results.c.host, benchmark_results.c.case_key)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
    for row in rows:
        for k, v in row.items():
            if isinstance(v, datetime):
                row[k] = (v if v.tzinfo else v.replace(tzinfo=timezone.utc)).isoformat()
    return rows


def latest_run_id(engine: Engine, dag_id: str | None = None) -> str | None:
    query = select(runs.c.run_id).order_by(runs.c.finished_at.desc().nulls_last(), runs.c.logical_date.desc()).limit(1)
    if dag_id:
        query = query.where(runs.c.dag_id == dag_id)
    with engine.connect() as conn:
        return conn.execute(query).scalar()


def fetch_capacity_features(engine: Engine, model: str | None = None) -> list[dict]:
    """Rows of the `capacity_features` view (task features next to resource features), optionally one model's."""
    sql = f"SELECT * FROM {CAPACITY_FEATURES_VIEW}" + (" WHERE model = :model" if model else "")
    sql += " ORDER BY host, case_key, run_id"
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), {"model": model} if model else {})]
