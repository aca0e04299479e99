"""One bad value never loses the night, on a real PostgreSQL server.

The run's own collect and store functions over real harness logs (the CPU smoke harness, run here) in
which the container printed malformed telemetry reports, a log with NUL bytes, host facts with a
kernel string and GPU name longer than their columns (and a NUL), and a case whose batch size is
beyond PostgreSQL's integer. Every case gets its row; the malformed telemetry is dropped (named in
telemetry_json), text is fitted, and the row that cannot be stored as measured is a failed row,
`store_error`, saying why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_configs import smoke_config, write_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "include" / "images" / "cpu-smoke" / "tf_cnn_benchmarks.py"
MARKER = "FLEETBENCH_TELEMETRY "


@pytest.fixture(scope="module")
def harness_log() -> str:
    """A real log of the smoke harness (trivial, batch 8, 3 batches)."""
    proc = subprocess.run([sys.executable, str(HARNESS), "--model=trivial", "--batch_size=8", "--num_batches=3",
                           "--num_warmup_batches=1", "--device=cpu", "--num_gpus=0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "total images/sec" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


TELEMETRY = {
    "smoke.trivial.bs8.g0.parameter_server": MARKER + '{"nvml": true, "energy_source": "measured", "energy_j": "lots", '
                                                      '"mean_power_w": NaN, '
                                                      '"gpus": [{"index": 0, "mean_util_pct": 1e400}]}',
    "smoke.trivial.bs16.g0.parameter_server": MARKER + "[1, 2]",
    "smoke.lenet.bs8.g0.parameter_server": MARKER + '{"nvml": true, "gpus": [1], "energy_j": 5.0, '
                                                    '"energy_source": "measured"}',
}


def test_a_night_of_bad_values_is_stored_whole(pg_database, harness_log, tmp_path, monkeypatch, smoke_image):
    from sqlalchemy import select

    from fleetbench.airflow.pipeline import collect, make_plan, store
    from fleetbench.warehouse import fetch_results, get_engine
    from fleetbench.warehouse.schema import host_facts

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", pg_database)
    monkeypatch.setenv("FLEETBENCH_DATA_DIR", str(tmp_path / "data"))
    cfg = write_config(tmp_path / "fleet.yaml",
                       smoke_config(smoke_image, models=("trivial", "lenet"), batch_sizes=(8, 16)))
    plan = make_plan({"dag_id": "fleet_benchmark", "run_id": "bad-values", "logical_date": "2026-12-01T02:00:00+00:00",
                      "run_type": "manual"}, str(cfg))
    keys = [c["case_key"] for c in plan["cases"]]
    big = "smoke.lenet.bs16.g0.parameter_server"
    assert set(TELEMETRY) | {big} == set(keys)
    next(c for c in plan["cases"] if c["case_key"] == big)["batch_size_per_device"] = 2**31 + 5

    kernel = "6.1.0-" + "x" * 200 + "\x00evil"
    gpu_name = "NVIDIA " + "H" * 300
    facts = {"kernel": kernel, "gpus": [{"index": 0, "name": gpu_name, "uuid": "GPU-1", "memory_total_mib": 80000}]}
    validations = [{"host": "localhost", "verdict": "ready", "reasons": "", "checks": [], "facts": facts,
                    "collected_at": "2026-12-01T02:00:01+00:00"}]
    prepared = [{"host": "localhost", "images": {"cpu-smoke": {"ref": smoke_image, "digest": "sha256:" + "a" * 64,
                                                               "pinned_ref": smoke_image, "failure_class": None}}}]
    outcomes = []
    for key in keys:
        path = tmp_path / f"{key}.log"
        if key == big:  # a failed case whose last words carry NUL bytes
            text, exit_code = harness_log.split("Done warm up")[0] + "fatal: bad \x00\x00 byte\n", 3
        else:
            text, exit_code = harness_log + TELEMETRY[key] + "\n", 0
        path.write_text(text)
        outcomes.append({"host": "localhost", "case_key": key, "exit_code": exit_code, "oom_killed": False,
                         "timed_out": False, "start_error_class": None, "log_path": str(path), "duration_s": 1.0,
                         "started_at": "2026-12-01T02:01:00+00:00", "finished_at": "2026-12-01T02:01:01+00:00"})

    collected = collect(plan, validations, prepared, outcomes)
    stored = store(plan, collected)
    assert stored["total"] == 4

    engine = get_engine(pg_database)
    try:
        rows = {r["case_key"]: r for r in fetch_results(engine, run_id="bad-values")}
        with engine.connect() as conn:
            host = conn.execute(select(host_facts.c.kernel, host_facts.c.gpu_model)).one()
    finally:
        engine.dispose()
    assert set(rows) == set(keys)
    for key in TELEMETRY:  # measured, with the malformed telemetry dropped and named
        row = rows[key]
        assert row["status"] == "ok" and row["images_per_sec"] > 0, row
        assert json.loads(row["telemetry_json"])["invalid"], row["telemetry_json"]
    lots, listed, gpus = (rows[k] for k in TELEMETRY)
    assert "energy_j: 'lots'" in lots["telemetry_json"] and lots["energy_source"] != "measured"
    assert listed["energy_source"] != "measured" and "a list, not an object" in listed["telemetry_json"]
    assert (gpus["energy_source"], gpus["energy_j"]) == ("measured", 5.0)  # the valid total stays; gpus[0] goes
    assert "gpus[0]: a int, not an object" in gpus["telemetry_json"]
    failed = rows[big]
    assert (failed["status"], failed["failure_class"]) == ("failed", "store_error")
    assert "batch_size_per_device: 2147483653" in failed["failure_detail"]
    assert "nonzero_exit" in failed["failure_detail"] and "\x00" not in failed["failure_detail"]
    assert len(host.kernel) == 100 and "\x00" not in host.kernel and host.kernel.startswith("6.1.0-xxx")
    assert len(host.gpu_model) == 200
    for row in rows.values():
        assert row["gpu_model"] is None or len(row["gpu_model"]) <= 200
