"""Reading the warehouse: result rows, the latest run, the capacity_features view."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterator

from sqlalchemy import DateTime, Engine, Integer, and_, literal, or_, select, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import GenericFunction

from fleetbench.warehouse.schema import CAPACITY_FEATURES_VIEW, benchmark_results, runs


def fetch_results(engine: Engine, run_id: str | None = None, dag_id: str | None = None, **window) -> list[dict]:
    """Result rows (newest run first, then host and case), as plain dicts with ISO timestamps; `window`: as
    `iter_results` takes it."""
    return list(iter_results(engine, run_id, dag_id, **window))


def iter_results(engine: Engine, run_id: str | None = None, dag_id: str | None = None, *,
                 since: datetime | None = None, until: datetime | None = None, host: str | None = None,
                 batch: int = 2000) -> Iterator[dict]:
    """`fetch_results`' rows as they are read, `batch` at a time (PostgreSQL: a server-side cursor), so that an
    export of every night holds one batch in memory, not the warehouse. The connection stays open until the
    iterator is exhausted or closed. `since`/`until`: logical dates from (inclusive) / before; `host`: its rows and
    the multi-node rows of sets it is in (`on_host`)."""
    query = select(benchmark_results)
    conds = result_filters(benchmark_results, run_id, dag_id, since=since, until=until, host=host)
    query = query.order_by(benchmark_results.c.logical_date.desc(), benchmark_results.c.run_id,
                           benchmark_results.c.host, benchmark_results.c.case_key)
    with engine.connect() as conn:
        if run_id and not dag_id:  # a run of any DAG: through the (dag_id, run_id, ...) key, one DAG at a time
            conds.append(benchmark_results.c.dag_id.in_(_dag_ids(conn)))
        if conds:
            query = query.where(and_(*conds))
        result = conn.execution_options(yield_per=batch).execute(query)
        for part in result.partitions():
            yield from iso_timestamps([dict(r._mapping) for r in part])


def result_filters(table, run_id: str | None = None, dag_id: str | None = None, *, since: datetime | None = None,
                   until: datetime | None = None, host: str | None = None) -> list:
    """The WHERE conditions of a read of result rows or attempts (`table`) by run, DAG, logical date and host."""
    conds = []
    if run_id:
        conds.append(table.c.run_id == run_id)
    if dag_id:
        conds.append(table.c.dag_id == dag_id)
    if since is not None:
        conds.append(table.c.logical_date >= since)
    if until is not None:
        conds.append(table.c.logical_date < until)
    if host:
        conds.append(on_host(table, host))
    return conds


def has_host(engine: Engine, host: str) -> bool:
    """Whether any result is of `host` (its own, or a multi-node set's it is in)."""
    with engine.connect() as conn:
        return conn.execute(select(literal(1)).where(on_host(benchmark_results, host)).limit(1)).first() is not None


def on_host(table, host: str):
    """The WHERE condition for a host's rows of `table`: its own, and where the table has `host_set`, the multi-node
    cases whose set includes it (a set's row is stored under its first host; `host_set` is "a,b,c")."""
    own = table.c.host == host
    if "host_set" not in table.c:
        return own
    # an exact item of the set: SQLite's LIKE ignores case (GPU-01 matched gpu-01's sets there, not on PostgreSQL)
    return or_(own, set_includes(table.c.host_set, host))


def set_includes(host_set, host):
    """The condition that the set `host_set` ("a,b,c", a column) has `host` (a column or text) as one of its hosts."""
    part = literal(f",{host},") if isinstance(host, str) else literal(",") + host + literal(",")
    return _position(literal(",") + host_set + literal(","), part) > 0


class _position(GenericFunction):
    """The 1-based position of a substring in a text, 0 where it is not in it; case-sensitive in both dialects:
    SQLite's instr(text, part), PostgreSQL's strpos(text, part)."""

    type = Integer()
    inherit_cache = True


@compiles(_position, "sqlite")
def _position_sqlite(element, compiler, **kw):
    return f"instr({compiler.process(element.clauses, **kw)})"


@compiles(_position)
def _position_default(element, compiler, **kw):
    return f"strpos({compiler.process(element.clauses, **kw)})"


def iso_timestamps(rows: list[dict]) -> list[dict]:
    """The rows with every datetime as ISO text in UTC (a naive one, as SQLite gives them, taken as UTC; an aware
    one, as PostgreSQL gives them in the session's zone, converted); in place."""
    for row in rows:
        for k, v in row.items():
            if isinstance(v, datetime):
                row[k] = (v.astimezone(timezone.utc) if v.tzinfo else v.replace(tzinfo=timezone.utc)).isoformat()
    return rows


def _dag_ids(conn) -> list[str]:
    """Every DAG id with results: one probe of the result key's index per DAG (a loose index scan)."""
    return [v for (v,) in conn.execute(text(
        "WITH RECURSIVE d(v) AS (SELECT MIN(dag_id) FROM benchmark_results UNION ALL "
        "SELECT (SELECT MIN(dag_id) FROM benchmark_results WHERE dag_id > d.v) FROM d WHERE d.v IS NOT NULL) "
        "SELECT v FROM d WHERE v IS NOT NULL"))]


def dag_ids(engine: Engine) -> list[str]:
    """The DAGs with a run in the warehouse, sorted."""
    with engine.connect() as conn:
        return sorted(conn.execute(select(runs.c.dag_id).distinct()).scalars())


def latest_run(engine: Engine, dag_id: str | None = None) -> tuple[str, str] | None:
    """(dag_id, run_id) of the run stored last (of one DAG, or of any). Both: two DAGs on one schedule share their
    run ids (`scheduled__<logical date>`), so a run id alone names a night of each."""
    query = select(runs.c.dag_id, runs.c.run_id).order_by(runs.c.finished_at.desc().nulls_last(),
                                                          runs.c.logical_date.desc()).limit(1)
    if dag_id:
        query = query.where(runs.c.dag_id == dag_id)
    with engine.connect() as conn:
        row = conn.execute(query).first()
    return (row.dag_id, row.run_id) if row is not None else None


def latest_run_id(engine: Engine, dag_id: str | None = None) -> str | None:
    latest = latest_run(engine, dag_id)
    return latest[1] if latest else None


def fetch_capacity_features(engine: Engine, model: str | None = None) -> list[dict]:
    """Rows of the `capacity_features` view (task features next to resource features), optionally one model's;
    timestamps as ISO text in UTC, as `fetch_results` gives them (SQLite would give its storage text)."""
    sql = f"SELECT * FROM {CAPACITY_FEATURES_VIEW}" + (" WHERE model = :model" if model else "")
    sql += " ORDER BY host, case_key, run_id"
    query = text(sql).columns(logical_date=DateTime(timezone=True))
    with engine.connect() as conn:
        return iso_timestamps([dict(r._mapping) for r in conn.execute(query, {"model": model} if model else {})])
