"""Writing a run: one transaction for its run row, host facts, results, steps and rollups; idempotent.

Rows are upserted keyed by (dag_id, run_id, host, case_key): benchmark_results holds each case's
current attempt. A retry writing the same attempt again replaces it; a new execution of the case (a
cleared and rerun run, a backfill that reprocesses it) first moves the stored attempt to
superseded_results (`fleetbench.warehouse.attempts`), so no measurement is ever deleted; a complete
store also moves there what the run no longer plans. Writers that race on the same keys
serialise on the run's row; rows are written in key order, and a transaction the database aborts to
break a deadlock is retried whole. Values are fitted to their columns first (`fit`).
"""

from __future__ import annotations

import json
import logging
import operator
import time
from datetime import datetime, timezone
from typing import Any, Iterable

from sqlalchemy import Engine, and_, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from fleetbench.timestamps import utc
from fleetbench.warehouse import attempts, bulk, fit, rollup
from fleetbench.warehouse.schema import (
    HOST_KEY,
    METRIC_KEY,
    RESULT_COLUMNS,
    RESULT_KEY,
    RUN_KEY,
    STEP_KEY,
    benchmark_results,
    host_facts,
    result_metrics,
    runs,
    steps,
)

# Tables of a result's own rows, replaced whole with it (and deleted with it).
_PER_RESULT = (steps, result_metrics)

log = logging.getLogger("fleetbench.warehouse")

# SQLSTATEs of transactions PostgreSQL aborted to break a deadlock or a serialisation conflict.
_RETRY_SQLSTATES = {"40P01", "40001"}
WRITE_ATTEMPTS = 4


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
    stmt = (stmt.on_conflict_do_update(index_elements=list(key), set_=updates) if updates
            else stmt.on_conflict_do_nothing())
    conn.execute(stmt, rows)


class _Rows:
    """Rows of one table as tuples in `columns` order: one per key (the last given wins), in key order."""

    def __init__(self, table, columns: list[str], rows: Iterable[tuple], key: tuple[str, ...]):
        self.table, self.columns, self.key = table, columns, key
        at = [columns.index(k) for k in key] if columns else []
        rows = list(rows)  # read twice below
        by_key = dict(zip(map(_getter(at), rows), rows))
        # Key order everywhere: two writers of overlapping keys lock rows in the same order.
        try:
            self.keys = sorted(by_key)
        except TypeError:  # a NULL or a number in a key column: order by text, NULL as ""
            self.keys = sorted(by_key, key=lambda k: tuple("" if v is None else str(v) for v in k))
        self.rows = [by_key[k] for k in self.keys]

    @classmethod
    def of_dicts(cls, table, rows: list[dict], key: tuple[str, ...]) -> "_Rows":
        columns = _columns(table, rows)
        fitted = fit.fit_rows([tuple(map(r.get, columns)) for r in rows], columns, table, key)
        return cls(table, columns, fitted, key)

    def upsert(self, conn) -> None:
        bulk.upsert(conn, self.table, self.columns, self.rows, self.key)

    def replace(self, conn, results: set[tuple]) -> None:
        """Write rows of results whose earlier rows of this table the transaction has just deleted: inserted as new
        rows (`bulk.insert_new`, no conflict check) when each belongs to one of `results`, else upserted."""
        n = len(RESULT_KEY)
        if all(k[:n] in results for k in self.keys):
            bulk.insert_new(conn, self.table, self.columns, self.rows, self.key)
        else:
            self.upsert(conn)


    def collected_at(self) -> dict[tuple, Any]:
        """Host rows: key -> collected_at (None where not given)."""
        at = self.columns.index("collected_at") if "collected_at" in self.columns else None
        return {k: (row[at] if at is not None else None) for k, row in zip(self.keys, self.rows)}


def _getter(at: list[int]):
    """row -> the tuple of its values at `at` (itemgetter returns a bare value for one index)."""
    if len(at) == 1:
        return lambda row: (row[at[0]],)
    return operator.itemgetter(*at) if at else (lambda row: ())


def _columns(table, rows: list[dict]) -> list[str]:
    """The table's columns that the first row names (rows of one write share their keys)."""
    unknown = sorted({c for r in rows for c in r} - set(table.c.keys()))
    if unknown:
        raise ValueError(f"{table.name}: no such column(s): {', '.join(unknown)}")
    return [c for c in table.c.keys() if rows and c in rows[0]]


def store_run(engine: Engine, run: dict, hosts: Iterable[dict], results: Iterable[dict], step_rows: Iterable[dict] = (),
              complete: bool = True, metric_rows: Iterable[dict] = ()) -> dict[str, int]:
    """Upsert one run's rows in one transaction, and its rollups from them.

    Returns `written` (the result rows written) and the run's case counts as its `runs` row now holds them:
    `total`, `ok`, `failed`, `skipped`. They count the run's results as stored, after fitting, whatever the given
    run row says: a row stored as failed / `store_error` is failed, and a partial write counts the whole run.

    `metric_rows`: the results' metric samples (`result_metrics`, see `rows.metric_sample_rows`); a result
    written now has exactly these afterwards, like its steps.
    `complete`: these are all of the run's hosts and results, so any other host row of the run stored
    before (a rerun planned fewer cases) is moved to superseded_host_facts in the same transaction, and any
    other result is moved to superseded_results with its steps and metric samples; False adds to the run
    (e.g. one host's rows of it) and keeps the rest. Each result's attempt number comes from
    `fleetbench.warehouse.attempts.decide`.

    PostgreSQL gets each table's rows with one COPY into a staging table and one INSERT ... ON
    CONFLICT, the steps and metric samples of the results written (whose earlier ones were just deleted) with
    one COPY straight into their table; SQLite with one prepared upsert over all rows
    (`fleetbench.warehouse.bulk`).
    """
    now = datetime.now(timezone.utc)
    dt = _DateCache()
    run_row = {**run, "logical_date": dt(run.get("logical_date")), "started_at": dt(run.get("started_at")),
               "finished_at": dt(run.get("finished_at"))}
    host_rows = _Rows.of_dicts(host_facts, [{**h, "collected_at": dt(h.get("collected_at"))} for h in hosts], HOST_KEY)
    result_rows = _Rows(benchmark_results, RESULT_COLUMNS,
                        fit.fit_results(_result_tuples(results, now, dt), RESULT_COLUMNS, benchmark_results),
                        RESULT_KEY)
    step_upserts = _Rows.of_dicts(steps, list(step_rows), STEP_KEY)
    metric_upserts = _Rows.of_dicts(result_metrics, list(metric_rows), METRIC_KEY)
    run_keys = {k[:2] for k in result_rows.keys} | ({(run_row["dag_id"], run_row["run_id"])} if complete else set())
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            with engine.begin() as conn:
                # The run's row first: concurrent writers of one run queue here, so each case's
                # result and steps end up from one writer, and its rollups are computed after the other's.
                upsert_rows(conn, runs, [run_row], RUN_KEY)
                # Attempt numbers; a stored attempt that a new execution replaces is kept as superseded, naming
                # the host check it ran under; then a host check that a new one replaces is kept too.
                run_key = (run_row["dag_id"], run_row["run_id"]) if complete else None
                numbered = attempts.number(conn, result_rows.columns, result_rows.rows, result_rows.keys, now,
                                           run_key)
                attempts.keep_host_facts(conn, host_rows.collected_at(), now, run_key)
                host_rows.upsert(conn)
                bulk.upsert(conn, benchmark_results, result_rows.columns, numbered, RESULT_KEY)
                # Steps and metrics of the cases written now are replaced as a whole: an earlier try's go.
                if result_rows.rows:
                    for table in _PER_RESULT:
                        if conn.dialect.name == "postgresql":
                            bulk.delete_staged(conn, table, benchmark_results, RESULT_KEY)
                        else:
                            bulk.delete_keys(conn, table, RESULT_KEY, result_rows.keys)
                written = set(result_rows.keys)
                step_upserts.replace(conn, written)
                metric_upserts.replace(conn, written)
                if complete:
                    _delete_rest_of_run(conn, run_row, host_rows.keys, result_rows.keys)
                counts = _count_cases(conn, run_row)
                rollup.refresh(conn, run_keys)
            return {"written": len(result_rows.rows), **counts}
        except DBAPIError as exc:
            if attempt == WRITE_ATTEMPTS or not _retryable(exc):
                raise
            log.warning("warehouse write of run %s aborted (%s), retrying (%d/%d)", run_row.get("run_id"),
                        str(exc.orig).splitlines()[0] if exc.orig else exc, attempt, WRITE_ATTEMPTS - 1)
            time.sleep(0.05 * 2 ** attempt)
    raise AssertionError("unreachable")


_COUNTS = {"total": "cases_total", "ok": "cases_ok", "failed": "cases_failed", "skipped": "cases_skipped"}


def _count_cases(conn, run_row: dict) -> dict[str, int]:
    """The run's stored results by status, written to its `runs` row (caller's transaction): the counts of what
    is stored, not of the rows as given, which fitting may have turned into failed / `store_error`."""
    of_run = (benchmark_results.c.dag_id == run_row["dag_id"], benchmark_results.c.run_id == run_row["run_id"])
    by_status = dict(conn.execute(select(benchmark_results.c.status, func.count()).where(*of_run)
                                  .group_by(benchmark_results.c.status)).all())
    counts = {"total": sum(by_status.values()), **{s: by_status.get(s, 0) for s in ("ok", "failed", "skipped")}}
    conn.execute(runs.update().where(runs.c.dag_id == run_row["dag_id"], runs.c.run_id == run_row["run_id"])
                 .values({_COUNTS[k]: v for k, v in counts.items()}))
    return counts


def _delete_rest_of_run(conn, run_row: dict, host_keys: list[tuple], result_keys: list[tuple]) -> None:
    """Delete the run's stored hosts, results, steps and metrics this write does not have (caller's transaction);
    `attempts.number` and `attempts.keep_host_facts` have kept such results and hosts as superseded already."""
    run_key = (run_row["dag_id"], run_row["run_id"])
    where = and_(*[c == v for c, v in zip((benchmark_results.c.dag_id, benchmark_results.c.run_id), run_key)])
    stored = {tuple(r) for r in conn.execute(select(*[benchmark_results.c[k] for k in RESULT_KEY]).where(where))}
    stale = sorted(stored - set(result_keys))
    if stale:
        log.info("run %s: %d result(s) stored before are not in this write: kept as superseded attempts",
                 run_key[1], len(stale))
        for table in _PER_RESULT:
            bulk.delete_keys(conn, table, RESULT_KEY, stale)
        bulk.delete_keys(conn, benchmark_results, RESULT_KEY, stale)
    hosts_where = and_(host_facts.c.dag_id == run_key[0], host_facts.c.run_id == run_key[1])
    stored_hosts = {tuple(r) for r in conn.execute(select(*[host_facts.c[k] for k in HOST_KEY]).where(hosts_where))}
    bulk.delete_keys(conn, host_facts, HOST_KEY, sorted(stored_hosts - set(host_keys)))


_RESULT_DATES = [RESULT_COLUMNS.index(c) for c in ("logical_date", "started_at", "finished_at")]
_COMMAND = RESULT_COLUMNS.index("command")
_STORED_AT = RESULT_COLUMNS.index("stored_at")
_NODES = RESULT_COLUMNS.index("nodes")


def _result_tuples(results: Iterable[dict], now: datetime, dt: "_DateCache") -> Iterable[tuple]:
    """Result rows as tuples in RESULT_COLUMNS order: timestamps as aware UTC datetimes, the command as
    JSON text, stored_at now, nodes 1 unless given (keys that are not columns are ignored)."""
    for r in results:
        row = list(map(r.get, RESULT_COLUMNS))
        for i in _RESULT_DATES:
            row[i] = dt(row[i])
        if isinstance(row[_COMMAND], (list, tuple)):
            row[_COMMAND] = json.dumps(row[_COMMAND])
        row[_STORED_AT] = now
        row[_NODES] = row[_NODES] or 1  # a row without it ran on one host
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
