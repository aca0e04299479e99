"""Regressions of non-image harnesses on PostgreSQL: each primary metric judged in its direction, stored with its unit,
also under a metric name of 100 characters (revision 0013 widened the column)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from fleetbench.regression import assess_run, store_findings
from fleetbench.warehouse import store_run, upgrade
from regression_rows import fetch_regressions
from warehouse_rows import result_row, run_row

pytestmark = pytest.mark.integration

LONG = ("team.inference." + "p99_latency_" * 7 + "ms")[:100]  # a metric name as long as a harness may give
NIGHT0 = datetime(2026, 11, 1, 2, tzinfo=timezone.utc)


def test_busbw_drop_and_latency_rise_are_regressions_and_a_rise_an_improvement(pg_engine):
    assert len(LONG) == 100
    upgrade(pg_engine)
    for night in range(14):
        off = night >= 12
        when = (NIGHT0 + timedelta(days=night)).isoformat()
        common = {"run_id": f"n{night}", "logical_date": when, "ips": None, "duration_s": 60.0, "cost_usd": 0.1}
        wobble = 1 + (night % 3 - 1) * 0.002
        store_run(pg_engine, {**run_row(f"n{night}"), "logical_date": when}, [], [
            result_row("nccl", harness="nccl_tests", metric="avg_busbw", value=(150.0 if off else 200.0) * wobble,
                       unit="GB/s", better="higher", **common),
            result_row("latency", harness="command", metric=LONG, value=(13.0 if off else 10.0) * wobble, unit="ms",
                       better="lower", **common),
            result_row("tokens", harness="command", metric="tokens_per_sec", value=(130.0 if off else 100.0) * wobble,
                       unit="tok/s", better="higher", **common)])
    found = assess_run(pg_engine, "fleet_benchmark", "n13").findings
    assert store_findings(pg_engine, "fleet_benchmark", "n13", found) == 3
    stored = {(r["case_key"], r["metric"]): r for r in fetch_regressions(pg_engine, run_id="n13")}
    assert set(stored) == {("nccl", "avg_busbw"), ("latency", LONG), ("tokens", "tokens_per_sec")}
    assert [(stored[k]["kind"], stored[k]["status"], stored[k]["direction"], stored[k]["unit"])
            for k in sorted(stored)] == [
        ("regression", "confirmed", "lower", "ms"), ("regression", "confirmed", "higher", "GB/s"),
        ("improvement", "confirmed", "higher", "tok/s")]
