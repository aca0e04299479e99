"""Values made to fit their columns, in one place, before a write.

PostgreSQL refuses a NUL byte in text, a string longer than its varchar, an integer beyond its
column's range or a non-number in a float column, and one refused value aborts the whole
transaction: the night's rows would be lost for one odd log line or kernel string. So every row is
fitted here first:

- text: NUL bytes removed, cut to the column's length (not a failure: the rest of the text is kept);
- integers and floats: a value that is not a number of that kind, or an integer outside the
  column's range, is dropped (NULL) and named.

`Fitter(table, columns)(row)` returns the row (a tuple in `columns` order) and what had to be dropped.
A night's rows are checked column by column first (`Fitter.all_fit`: a few C-level passes over each
column); only when some value would change are the rows fitted one by one.
A result row with something dropped is stored as a failed row, `store_error`, with the reason
(`fit_results`); other tables log and store what fits.
"""

from __future__ import annotations

import logging
import math
from typing import Iterable, Sequence

from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Table, Text

log = logging.getLogger(__name__)

INT_RANGES = {"int": (-2**31, 2**31 - 1), "bigint": (-2**63, 2**63 - 1)}
STORE_ERROR = "store_error"


def _kind(column) -> tuple[str, int | None] | None:
    t = column.type
    if isinstance(t, Boolean):
        return None
    if isinstance(t, BigInteger):
        return "bigint", None
    if isinstance(t, Integer):
        return "int", None
    if isinstance(t, Float):
        return "float", None
    if isinstance(t, (String, Text)):
        return "text", getattr(t, "length", None)
    return None


class Fitter:
    def __init__(self, table: Table, columns: Sequence[str]):
        self.table = table
        self.checks = [(i, name, *kind) for i, name in enumerate(columns) if (kind := _kind(table.c[name]))]

    def all_fit(self, rows: Sequence[tuple]) -> bool:
        """True when `__call__` would return every row unchanged; decided per column, not per value. False
        (fit row by row) on anything unusual: a NUL byte, a string over its length, a non-number or an
        out-of-range integer, a bool or a number of another type (numpy's)."""
        if not rows:
            return True
        by_column = list(zip(*rows))
        for i, _name, kind, length in self.checks:
            col = by_column[i]
            types = set(map(type, col))
            types.discard(type(None))
            if kind == "text":
                if not any(issubclass(t, str) for t in types):
                    continue  # None, datetimes, JSON the driver renders: passed as they are
                strs = [v for v in col if v is not None] if types == {str} else [v for v in col if isinstance(v, str)]
                if (length is not None and max(map(len, strs)) > length) or "\x00" in "".join(strs):
                    return False
            elif kind == "float":
                if not types <= {float, int}:
                    return False
                if int in types and max((abs(v) for v in col if type(v) is int), default=0) >= 1e300:
                    return False
            else:
                if not types <= {int}:
                    return False
                values = [v for v in col if v is not None]
                lo, hi = INT_RANGES[kind]
                if values and (min(values) < lo or max(values) > hi):
                    return False
        return True

    def __call__(self, row: tuple) -> tuple[tuple, list[str]]:
        fixed: list | None = None
        dropped: list[str] = []
        for i, name, kind, length in self.checks:
            value = row[i]
            if value is None:
                continue
            new = _fit(value, kind, length)
            if new is value:
                continue
            if fixed is None:
                fixed = list(row)
            if new is None:
                dropped.append(f"{name}: {_show(value)} does not fit {self.table.name}.{name}")
            fixed[i] = new
        return (row if fixed is None else tuple(fixed)), dropped


def _fit(value, kind: str, length: int | None):
    """`value` if it fits, a fitted copy (text), or None when it cannot be stored."""
    if kind == "text":
        if not isinstance(value, str):
            return value  # e.g. a datetime or JSON the driver renders itself
        if "\x00" in value:
            value = value.replace("\x00", "")
        return value[:length] if length is not None and len(value) > length else value
    if isinstance(value, bool):
        return int(value) if kind != "float" else float(value)
    if kind == "float":
        return value if isinstance(value, (int, float)) and (not isinstance(value, int) or abs(value) < 1e300) else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        return None
    lo, hi = INT_RANGES[kind]
    return value if lo <= value <= hi else None


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def fit_results(rows: Iterable[tuple], columns: Sequence[str], table: Table) -> list[tuple]:
    """Result rows fitted to `table`; a row with a dropped value becomes failed, `store_error`, naming it."""
    fitter = Fitter(table, columns)
    rows = list(rows)
    if fitter.all_fit(rows):
        return rows
    return list(_fit_results(rows, columns, table, fitter))


def _fit_results(rows: Iterable[tuple], columns: Sequence[str], table: Table, fitter: Fitter) -> Iterable[tuple]:
    status, klass, detail = (columns.index(c) for c in ("status", "failure_class", "failure_detail"))
    for row in rows:
        row, dropped = fitter(row)
        if dropped:
            row = list(row)
            log.warning("result %s: stored as failed (%s): %s", row[columns.index("case_key")], STORE_ERROR,
                        "; ".join(dropped))
            before = f" (was {row[status]}: {row[klass]}: {row[detail]})" if row[klass] else f" (was {row[status]})"
            row[status], row[klass] = "failed", STORE_ERROR
            row[detail] = ("could not be stored as measured: " + "; ".join(dropped) + before)[:4000]
            row = tuple(row)
        yield row


def fit_rows(rows: Iterable[tuple], columns: Sequence[str], table: Table, key: Sequence[str] = ()) -> list[tuple]:
    """Rows of another table fitted to it: dropped values are logged and stored as NULL, and a row whose
    key lost a value is left out (logged), since it has nowhere to go."""
    fitter = Fitter(table, columns)
    rows = list(rows)
    if fitter.all_fit(rows):
        return rows
    return list(_fit_rows(rows, table, key, fitter))


def _fit_rows(rows: Iterable[tuple], table: Table, key: Sequence[str], fitter: Fitter) -> Iterable[tuple]:
    for row in rows:
        row, dropped = fitter(row)
        if dropped:
            lost_key = any(d.split(":", 1)[0] in key for d in dropped)
            log.warning("%s row %s: %s", table.name, "left out" if lost_key else "stored without", "; ".join(dropped))
            if lost_key:
                continue
        yield row
