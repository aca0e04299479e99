"""The warehouse: SQLite by default (`.data/warehouse.db`), PostgreSQL in production.

`FLEETBENCH_WAREHOUSE_URL` picks the database. Writes are idempotent and atomic: one run's rows
are upserted in one transaction keyed by (dag_id, run_id, host, case_key), so a retry or rerun
replaces its own rows and a failure mid-write leaves nothing partial. Writers that race on the same
keys (a task retried while its first try still writes) serialise on the run's row; rows are written
in key order, and a transaction the database aborts to break a deadlock is retried whole.

The same transaction rewrites the run's rollups (`fleetbench.warehouse.rollup`: per run and host,
per run and case across the fleet) from its stored results, so the report's aggregates never
disagree with the rows they summarise.
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
from sqlalchemy import Engine, and_, create_engine, event, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from fleetbench.paths import data_dir
from fleetbench.timestamps import utc
from fleetbench.warehouse import bulk, fit, rollup
from fleetbench.warehouse.schema import (CAPACITY_FEATURES_VIEW, HOST_KEY, RESULT_COLUMNS, RESULT_KEY, RUN_KEY, STEP_KEY,
                                         benchmark_results, host_facts, runs, steps)

log = logging.getLogger(__name__)

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


def warehouse_read_url() -> str:
    """The URL for code that only reads the warehouse (the results view): `FLEETBENCH_WAREHOUSE_READ_URL`
    when set (a role that may only SELECT, as docker-compose.yaml's reader), else `warehouse_url()`."""
    return os.environ.get("FLEETBENCH_WAREHOUSE_READ_URL") or warehouse_url()


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


def upsert_rows(conn, table, rows: list[dict], key: tuple[str, ...]) -> None:
    """Upsert a few rows (dicts) through SQLAlchemy, in the caller's transaction (e.g. a run's regressions)."""
    if not rows:
        return
    dialect = conn.dialect.name
    insert = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}.get(dialect)
    if insert is None:  # other databases: delete then insert, still inside the caller's transaction
        bulk.delete_keys(conn, table, key, [tuple(r[k] for k in key) for r in rows])
        conn.execute(table.insert(), rows)
        return
    stmt = insert(table)
    updates = {c: stmt.excluded[c] for c in rows[0] if c not in key}
    stmt = stmt.on_conflict_do_update(index_elements=list(key), set_=updates) if updates else stmt.on_conflict_do_nothing()
    conn.execute(stmt, rows)


class _Rows:
    """Rows of one table as tuples in `columns` order: one per key (the last given wins), in key order."""

    def __init__(self, table, columns: list[str], rows: Iterable[tuple], key: tuple[str, ...]):
        self.table, self.columns, self.key = table, columns, key
        at = [columns.index(k) for k in key] if columns else []
        by_key = {tuple(row[i] for i in at): row for row in rows}
        # Key order everywhere: two writers of overlapping keys lock rows in the same order.
        try:
            self.keys = sorted(by_key)
        except TypeError:  # a NULL or a number in a key column: order by text, NULL as ""
            self.keys = sorted(by_key, key=lambda k: tuple("" if v is None else str(v) for v in k))
        self.rows = [by_key[k] for k in self.keys]

    @classmethod
    def of_dicts(cls, table, rows: list[dict], key: tuple[str, ...]) -> "_Rows":
        columns = _columns(table, rows)
        return cls(table, columns, fit.fit_rows((tuple(r.get(c) for c in columns) for r in rows), columns, table, key), key)

    def upsert(self, conn) -> None:
        bulk.upsert(conn, self.table, self.columns, self.rows, self.key)


def _columns(table, rows: list[dict]) -> list[str]:
    """The table's columns that the first row names (rows of one write share their keys)."""
    unknown = sorted({c for r in rows for c in r} - set(table.c.keys()))
    if unknown:
        raise ValueError(f"{table.name}: no such column(s): {', '.join(unknown)}")
    return [c for c in table.c.keys() if rows and c in rows[0]]


def store_run(engine: Engine, run: dict, hosts: Iterable[dict], results: Iterable[dict], step_rows: Iterable[dict] = (),
              complete: bool = True) -> int:
    """Upsert one run's rows in one transaction, and its rollups from them; returns the number of result rows written.

    `complete`: these are all of the run's hosts and results, so any other host or result row of the run
    stored before (a rerun planned fewer cases) is deleted in the same transaction, with its steps;
    False adds to the run (e.g. one host's rows of it) and keeps the rest.

    PostgreSQL gets each table's rows with one COPY into a staging table and one INSERT ... ON
    CONFLICT; SQLite with one prepared upsert over all rows (`fleetbench.warehouse.bulk`).
    """
    now = datetime.now(timezone.utc)
    dt = _DateCache()
    run_row = {**run, "logical_date": dt(run.get("logical_date")), "started_at": dt(run.get("started_at")),
               "finished_at": dt(run.get("finished_at"))}
    host_rows = _Rows.of_dicts(host_facts, [{**h, "collected_at": dt(h.get("collected_at"))} for h in hosts], HOST_KEY)
    result_rows = _Rows(benchmark_results, RESULT_COLUMNS,
                        fit.fit_results(_result_tuples(results, now, dt), RESULT_COLUMNS, benchmark_results), RESULT_KEY)
    step_upserts = _Rows.of_dicts(steps, list(step_rows), STEP_KEY)
    run_keys = {k[:2] for k in result_rows.keys} | ({(run_row["dag_id"], run_row["run_id"])} if complete else set())
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                # The run's row first: concurrent writers of one run queue here, so each case's
                # result and steps end up from one writer, and its rollups are computed after the other's.
                upsert_rows(conn, runs, [run_row], RUN_KEY)
                host_rows.upsert(conn)
                result_rows.upsert(conn)
                # Steps of the cases written now are replaced as a whole: stale steps from an earlier try go.
                if result_rows.rows:
                    if conn.dialect.name == "postgresql":
                        bulk.delete_staged(conn, steps, benchmark_results, RESULT_KEY)
                    else:
                        bulk.delete_keys(conn, steps, RESULT_KEY, result_rows.keys)
                step_upserts.upsert(conn)
                if complete:
                    _delete_rest_of_run(conn, run_row, host_rows.keys, result_rows.keys)
                rollup.refresh(conn, run_keys)
            return len(result_rows.rows)
        except DBAPIError as exc:
            if attempt == WRITE_ATTEMPTS or not _retryable(exc):
                raise
            log.warning("warehouse write of run %s aborted (%s), retrying (%d/%d)", run_row.get("run_id"),
                        str(exc.orig).splitlines()[0] if exc.orig else exc, attempt, WRITE_ATTEMPTS - 1)
            time.sleep(0.05 * 2 ** attempt)
    raise AssertionError("unreachable")


def _delete_rest_of_run(conn, run_row: dict, host_keys: list[tuple], result_keys: list[tuple]) -> None:
    """Delete the run's stored hosts, results and steps that this write does not have (caller's transaction)."""
    run_key = (run_row["dag_id"], run_row["run_id"])
    where = and_(*[c == v for c, v in zip((benchmark_results.c.dag_id, benchmark_results.c.run_id), run_key)])
    stored = {tuple(r) for r in conn.execute(select(*[benchmark_results.c[k] for k in RESULT_KEY]).where(where))}
    stale = sorted(stored - set(result_keys))
    if stale:
        log.info("run %s: %d result(s) stored before are not in this write: deleted", run_key[1], len(stale))
        bulk.delete_keys(conn, steps, RESULT_KEY, stale)
        bulk.delete_keys(conn, benchmark_results, RESULT_KEY, stale)
    hosts_where = and_(host_facts.c.dag_id == run_key[0], host_facts.c.run_id == run_key[1])
    stored_hosts = {tuple(r) for r in conn.execute(select(*[host_facts.c[k] for k in HOST_KEY]).where(hosts_where))}
    bulk.delete_keys(conn, host_facts, HOST_KEY, sorted(stored_hosts - set(host_keys)))


_RESULT_DATES = [RESULT_COLUMNS.index(c) for c in ("logical_date", "started_at", "finished_at")]
_COMMAND = RESULT_COLUMNS.index("command")
_STORED_AT = RESULT_COLUMNS.index("stored_at")


def _result_tuples(results: Iterable[dict], now: datetime, dt: "_DateCache") -> Iterable[tuple]:
    """Result rows as tuples in RESULT_COLUMNS order: timestamps as aware UTC datetimes, the command as
    JSON text, stored_at now (keys that are not columns are ignored)."""
    for r in results:
        get = r.get
        row = [get(c) for c in RESULT_COLUMNS]
        for i in _RESULT_DATES:
            row[i] = dt(row[i])
        if isinstance(row[_COMMAND], (list, tuple)):
            row[_COMMAND] = json.dumps(row[_COMMAND])
        row[_STORED_AT] = now
        yield tuple(row)


class _DateCache:
    """`utc` with a memory: a night's rows repeat a handful of timestamps thousands of times."""

    def __init__(self):
        self.seen: dict[Any, datetime | None] = {}

    def __call__(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, datetime) and value.tzinfo is timezone.utc:
            return value
        try:
            return self.seen[value]
        except KeyError:
            converted = self.seen[value] = utc(value)
            return converted
        except TypeError:  # not hashable
            return utc(value)


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
    query = query.order_by(benchmark_results.c.logical_date.desc(), benchmark_results.c.run_id,
                           benchmark_results.c.host, benchmark_results.c.case_key)
    with engine.connect() as conn:
        if run_id and not dag_id:  # a run of any DAG: through the (dag_id, run_id, ...) key, one DAG at a time
            conds.append(benchmark_results.c.dag_id.in_(_dag_ids(conn)))
        if conds:
            query = query.where(and_(*conds))
        rows = [dict(r._mapping) for r in conn.execute(query)]
    for row in rows:
        for k, v in row.items():
            if isinstance(v, datetime):
                row[k] = (v if v.tzinfo else v.replace(tzinfo=timezone.utc)).isoformat()
    return rows


def _dag_ids(conn) -> list[str]:
    """Every DAG id with results: one probe of the result key's index per DAG (a loose index scan)."""
    return [v for (v,) in conn.execute(text(
        "WITH RECURSIVE d(v) AS (SELECT MIN(dag_id) FROM benchmark_results UNION ALL "
        "SELECT (SELECT MIN(dag_id) FROM benchmark_results WHERE dag_id > d.v) FROM d WHERE d.v IS NOT NULL) "
        "SELECT v FROM d WHERE v IS NOT NULL"))]


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
