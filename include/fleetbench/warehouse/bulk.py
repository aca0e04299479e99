"""Bulk upserts of many rows inside the caller's transaction, one statement per table instead of one per row.

- PostgreSQL: COPY the rows into a temporary staging table (dropped at commit), then one
  `INSERT ... SELECT ... ORDER BY <key> ON CONFLICT (<key>) DO UPDATE`. The staging table also
  serves joins, e.g. deleting the steps of every staged case with one DELETE ... USING. Rows that
  cannot conflict (a case's metric samples right after its old ones were deleted) are COPied straight
  into their table (`insert_new`). COPY's text is built column by column.
- SQLite: one prepared `INSERT ... ON CONFLICT DO UPDATE` run over all rows by the driver (executemany).
- Anything else: SQLAlchemy's executemany, as a delete of the keys then an insert.

Rows are tuples in `columns` order, already unique per key; both databases see them in key order,
so two writers of overlapping keys take their row locks in the same order.
"""

from __future__ import annotations

import io
from datetime import date, datetime
from typing import Any, Callable, Sequence

from sqlalchemy import BigInteger, Boolean, DateTime, Float, Integer, Table, delete, tuple_
from sqlalchemy.exc import DBAPIError

DELETE_CHUNK = 1000  # keys per DELETE ... WHERE (..) IN (..) statement (not SQLite: see delete_keys)


def q(name: str) -> str:
    """A quoted identifier (column names such as `precision` are keywords)."""
    return '"' + name.replace('"', '""') + '"'


def stage_name(table: Table) -> str:
    return f"fleetbench_stage_{table.name}"


def upsert(conn, table: Table, columns: Sequence[str], rows: list[tuple], key: Sequence[str]) -> None:
    if not rows:
        return
    dialect = conn.dialect.name
    if dialect == "postgresql":
        _pg_upsert(conn, table, columns, rows, key)
    elif dialect == "sqlite":
        _sqlite_upsert(conn, table, columns, rows, key)
    else:
        keys = [tuple(r[columns.index(k)] for k in key) for r in rows]
        delete_keys(conn, table, key, keys)
        conn.execute(table.insert(), [dict(zip(columns, r)) for r in rows])


def insert_new(conn, table: Table, columns: Sequence[str], rows: list[tuple], key: Sequence[str]) -> None:
    """Insert rows none of whose keys is in `table` (the caller has just deleted them, in its transaction): one
    COPY into the table on PostgreSQL, no staging and no conflict check; `upsert` elsewhere."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        upsert(conn, table, columns, rows, key)
        return
    _copy(conn, q(table.name), table, columns, rows)


def delete_keys(conn, table: Table, key: Sequence[str], keys: list[tuple]) -> None:
    """DELETE the rows of `table` whose `key` columns are one of `keys`.

    SQLite: one prepared `DELETE ... WHERE k1 = ? AND k2 = ? ...` run over all keys by the driver (executemany),
    each an index search on the key. Not one `(k1, k2, ..) IN (VALUES ..)`: SQLite plans that as a scan of the whole
    table testing each row against the list, so a night's store read every step and metric sample of the year.
    Elsewhere in chunks of DELETE_CHUNK (one IN list of 20,000 row values overflows PostgreSQL's parser stack)."""
    if not keys:
        return
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(sqlite_delete(table, key), [tuple(k) for k in keys])
        return
    cols = tuple_(*[table.c[k] for k in key])
    for i in range(0, len(keys), DELETE_CHUNK):
        conn.execute(delete(table).where(cols.in_(keys[i:i + DELETE_CHUNK])))


def sqlite_delete(table: Table, key: Sequence[str]) -> str:
    """The SQLite statement `delete_keys` runs once per key."""
    return f"DELETE FROM {q(table.name)} WHERE " + " AND ".join(f"{q(k)} = ?" for k in key)


def delete_staged(conn, table: Table, staged: Table, key: Sequence[str]) -> None:
    """PostgreSQL: DELETE the rows of `table` whose `key` matches a row staged for `staged` by `upsert`."""
    match = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in key)
    conn.exec_driver_sql(f"DELETE FROM {q(table.name)} t USING {q(stage_name(staged))} s WHERE {match}")


# -- PostgreSQL ---------------------------------------------------------------------------------------
def _pg_upsert(conn, table: Table, columns: Sequence[str], rows: list[tuple], key: Sequence[str]) -> None:
    stage, target = q(stage_name(table)), q(table.name)
    cols = ", ".join(q(c) for c in columns)
    keys = ", ".join(q(k) for k in key)
    updates = [c for c in columns if c not in key]
    action = ("DO UPDATE SET " + ", ".join(f"{q(c)} = EXCLUDED.{q(c)}" for c in updates)) if updates else "DO NOTHING"
    conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {stage} ON COMMIT DROP AS SELECT {cols} FROM {target} WITH NO DATA")
    _copy(conn, stage, table, columns, rows)
    conn.exec_driver_sql(f"INSERT INTO {target} ({cols}) SELECT {cols} FROM {stage} ORDER BY {keys} "
                         f"ON CONFLICT ({keys}) {action}")


def _copy(conn, into: str, table: Table, columns: Sequence[str], rows: list[tuple]) -> None:
    """COPY the rows into the (quoted) table `into`, whose columns are `table`'s."""
    cells = [_copy_column(table.c[c].type, col) for c, col in zip(columns, zip(*rows))]
    buf = io.StringIO("\n".join(map("\t".join, zip(*cells))) + "\n")
    copy = f"COPY {into} ({', '.join(q(c) for c in columns)}) FROM STDIN"
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.copy_expert(copy, buf)
    except conn.dialect.loaded_dbapi.Error as exc:  # as SQLAlchemy raises what the driver raised
        raise DBAPIError.instance(copy, None, exc, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect) from exc
    finally:
        cursor.close()


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
NULL = "\\N"


def _text(v: Any) -> str:
    if v is None:
        return NULL
    s = v if isinstance(v, str) else str(v)
    return s.translate(_ESCAPES) if ("\\" in s or "\t" in s or "\n" in s or "\r" in s) else s


def _integer(v: Any) -> str:
    if v is None:
        return NULL
    if isinstance(v, float) and v.is_integer():  # 100.0 for an INTEGER column: what PostgreSQL would cast
        return str(int(v))
    return _text(v)


def _float(v: Any) -> str:
    if v is None:
        return NULL
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(float(v))  # nan, inf and -inf are what float8 input reads too
    return _text(v)


def _timestamps() -> Callable[[Any], str]:
    """A formatter of timestamps that remembers them: a night's rows share a few."""
    seen: dict[Any, str] = {}

    def fmt(v: Any) -> str:
        if v is None:
            return NULL
        try:
            return seen[v]
        except KeyError:
            text = seen[v] = v.isoformat() if isinstance(v, (datetime, date)) else _text(v)
            return text
        except TypeError:
            return _text(v)
    return fmt


def _boolean(v: Any) -> str:
    if v is None:
        return NULL
    if isinstance(v, bool):
        return "t" if v else "f"
    return _text(v)


_SPECIAL = ("\\", "\t", "\n", "\r")
_NONE = type(None)


def _copy_column(type_, col: Sequence) -> list[str]:
    """One column's values in COPY's text format. The common cases (all text without escapes, all floats, all
    integers) in one comprehension; anything else value by value (`_copy_format`)."""
    types = set(map(type, col))
    types.discard(_NONE)
    if isinstance(type_, Float) and types <= {float}:
        return [NULL if v is None else repr(v) for v in col]  # nan, inf and -inf are what float8 input reads too
    if isinstance(type_, (Integer, BigInteger)) and types <= {int}:
        return [NULL if v is None else str(v) for v in col]
    if not isinstance(type_, (Boolean, Integer, BigInteger, Float, DateTime)) and types <= {str}:
        joined = "".join([v for v in col if v is not None])
        if not any(c in joined for c in _SPECIAL):
            return [NULL if v is None else v for v in col]
    return list(map(_copy_format(type_)(), col))


def _copy_format(type_) -> Callable[[], Callable[[Any], str]]:
    """A maker of the formatter of values for a column of this type, in COPY's text format."""
    if isinstance(type_, Boolean):
        return lambda: _boolean
    if isinstance(type_, (Integer, BigInteger)):
        return lambda: _integer
    if isinstance(type_, Float):
        return lambda: _float
    if isinstance(type_, DateTime):
        return _timestamps
    return lambda: _text


# -- SQLite -------------------------------------------------------------------------------------------
def _sqlite_upsert(conn, table: Table, columns: Sequence[str], rows: list[tuple], key: Sequence[str]) -> None:
    dialect = conn.dialect
    # The column types' own bind processing (e.g. DateTime's text format), applied where there is one.
    processors = [(i, p) for i, c in enumerate(columns)
                  if (p := table.c[c].type.dialect_impl(dialect).bind_processor(dialect)) is not None]
    if processors:
        converted = []
        for row in rows:
            row = list(row)
            for i, p in processors:
                row[i] = p(row[i])
            converted.append(tuple(row))
        rows = converted
    cols = ", ".join(q(c) for c in columns)
    updates = [c for c in columns if c not in key]
    action = ("DO UPDATE SET " + ", ".join(f"{q(c)} = excluded.{q(c)}" for c in updates)) if updates else "DO NOTHING"
    sql = (f"INSERT INTO {q(table.name)} ({cols}) VALUES ({', '.join('?' * len(columns))}) "
           f"ON CONFLICT ({', '.join(q(k) for k in key)}) {action}")
    conn.exec_driver_sql(sql, rows)
