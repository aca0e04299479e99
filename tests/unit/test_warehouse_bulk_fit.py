"""The column-wise fast paths of a warehouse write agree with the value-by-value ones they skip."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest
from sqlalchemy import BigInteger, Boolean, Column, DateTime, Float, Integer, MetaData, String, Table, Text

from fleetbench.warehouse import bulk
from fleetbench.warehouse.fit import Fitter, fit_results, fit_rows
from fleetbench.warehouse.schema import RESULT_COLUMNS, benchmark_results

TABLE = Table("t", MetaData(), Column("name", String(8)), Column("note", Text), Column("n", Integer),
              Column("big", BigInteger), Column("x", Float), Column("at", DateTime(timezone=True)),
              Column("ok", Boolean))
COLUMNS = [c.name for c in TABLE.columns]
GOOD = [("abc", "free text", 1, 2**40, 1.5, datetime(2026, 12, 1, tzinfo=timezone.utc), True),
        (None, None, None, None, None, None, None), ("", "", -5, 0, float("nan"), None, False),
        ("12345678", "x" * 10_000, 2**31 - 1, -2**63, 7, None, None)]


def row_by_row(rows):
    fitter = Fitter(TABLE, COLUMNS)
    return [fitter(r) for r in rows]


def test_rows_that_fit_are_passed_through_whole():
    assert Fitter(TABLE, COLUMNS).all_fit(GOOD) and Fitter(TABLE, COLUMNS).all_fit([])
    assert all(not dropped and fitted is row for (fitted, dropped), row in zip(row_by_row(GOOD), GOOD))
    assert fit_rows(GOOD, COLUMNS, TABLE) == GOOD


@pytest.mark.parametrize("i, bad", [
    (0, "123456789"),  # longer than VARCHAR(8)
    (1, "nul\x00byte"),
    (2, 2**31),  # beyond INTEGER
    (2, 3.0),  # an integral float in an INTEGER column: made an int
    (2, "7"),
    (3, True),
    (4, "fast"),
    (4, np.float64(1.5)),  # a number of another type: fitted one by one (kept)
    (4, 10**301),
    (4, False),
])
def test_one_odd_value_sends_the_rows_the_slow_way(i, bad):
    rows = [*GOOD, tuple(bad if j == i else v for j, v in enumerate(GOOD[0]))]
    assert not Fitter(TABLE, COLUMNS).all_fit(rows)
    assert fit_rows(rows, COLUMNS, TABLE) == [fitted for fitted, _ in row_by_row(rows)]


def test_a_result_that_does_not_fit_is_stored_as_failed():
    row = [None] * len(RESULT_COLUMNS)
    for name, value in (("dag_id", "d"), ("run_id", "r"), ("host", "h"), ("case_key", "c"), ("status", "ok"),
                        ("exit_code", 2**40)):
        row[RESULT_COLUMNS.index(name)] = value
    ok = tuple(v if i != RESULT_COLUMNS.index("exit_code") else 0 for i, v in enumerate(row))
    out = fit_results([ok, tuple(row)], RESULT_COLUMNS, benchmark_results)
    assert out[0] is ok
    assert (out[1][RESULT_COLUMNS.index("status")], out[1][RESULT_COLUMNS.index("failure_class")]) == (
        "failed", "store_error")


@pytest.mark.parametrize("type_, values", [
    (String(20), ["plain", None, ""]),
    (String(20), ["tab\there", "new\nline", "back\\slash", "cr\r", None]),
    (String(20), ["text", 5, None]),  # not all text
    (Float(), [1.5, None, float("nan"), float("inf"), -0.0, 1e-300]),
    (Float(), [1, 2.5, None, True]),
    (Integer(), [1, None, -2**31]),
    (Integer(), [1, 2.0, None, False]),
    (BigInteger(), [2**62, None]),
    (DateTime(timezone=True), [datetime(2026, 12, 1, tzinfo=timezone.utc), None, "2026-12-01"]),
    (Boolean(), [True, False, None]),
])
def test_copy_text_of_a_column_is_what_the_value_formatters_write(type_, values):
    assert bulk._copy_column(type_, values) == [bulk._copy_format(type_)()(v) for v in values]
