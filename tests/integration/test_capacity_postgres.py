"""Capacity profiles read from a real PostgreSQL warehouse: the model and DAG filters, each host's newest
GPU facts, and the plan's verdicts from them."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from fleetbench.capacity import Settings, fit_profiles, read_gpu_memory, read_rows, report_section
from fleetbench.warehouse import store_run, upgrade
from warehouse_rows import result_row, run_row

pytestmark = pytest.mark.integration


def test_profiles_from_postgres(pg_engine):
    upgrade(pg_engine)
    rows = [result_row(f"cnn.resnet50.bs{b}.g1.replicated", batch_size_per_device=b, peak_gpu_mem_mib=1000.0 + 60 * b)
            for b in (32, 64, 128, 256)]
    rows.append(result_row("cnn.resnet50.bs512.g1.replicated", batch_size_per_device=512, status="failed", ips=None,
                           capacity_mib=40960.0, predicted_mem_mib=31720.0, capacity_note="fits: 31720 +- 50 MiB"))
    host = {"dag_id": "fleet_benchmark", "run_id": "r1", "host": "h1", "verdict": "ready",
            "facts_json": json.dumps({"gpus": [{"memory_total_mib": 40960}]}),
            "collected_at": datetime(2026, 12, 1, 2, tzinfo=timezone.utc)}
    store_run(pg_engine, run_row("r1"), [host], rows, [])
    store_run(pg_engine, {**run_row("r2"), "dag_id": "other"}, [],
              [dict(result_row("x", run_id="r2", model="vgg16", peak_gpu_mem_mib=9000.0), dag_id="other")], [])

    got = read_rows(pg_engine, ["resnet50"])
    assert len(got) == 4 + 1 + 1 and {r["model"] for r in got} == {"resnet50"}  # readings, the OOM's bound, the miss
    (profile,) = fit_profiles(got, Settings()).values()
    assert (profile.slope, profile.intercept, profile.n) == (60.0, 1000.0, 4)
    assert profile.ooms == {40960.0: 512} and [m["case_key"] for m in profile.misses] == [
        "cnn.resnet50.bs512.g1.replicated"]
    assert read_gpu_memory(pg_engine, ["h1", "h2"]) == {"h1": 40960.0}
    # the next night a forced rerun runs batch 512 on 40 GiB: the bound is lifted, the miss stays on record
    later = "2026-12-02T02:00:00+00:00"
    store_run(pg_engine, {**run_row("r3"), "logical_date": later}, [],
              [result_row("cnn.resnet50.bs512.g1.replicated", run_id="r3", logical_date=later,
                          batch_size_per_device=512, capacity_mib=40960.0, peak_gpu_mem_mib=31700.0)], [])
    (profile,) = fit_profiles(read_rows(pg_engine, ["resnet50"]), Settings()).values()
    assert profile.ooms == {} and len(profile.misses) == 1 and profile.n == 5
    with pg_engine.connect() as conn:
        assert [p["model"] for p in report_section(conn, dag_ids={"fleet_benchmark"})] == ["resnet50"]
        assert {p["model"] for p in report_section(conn)} == {"resnet50", "vgg16"}
