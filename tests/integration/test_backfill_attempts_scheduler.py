"""A backfill after a driver upgrade keeps its "before", for real: a running scheduler (LocalExecutor)
executes `airflow backfill create` of three nights on driver A, then the same nights again with
`--reprocess-behavior completed` on driver B. Every case then has 2 attempts; the current ones are
B's; `fleetbench compare --attempts` shows A against B per case; the regression detector sees only
current attempts; and clearing a night's store task (the same container outcomes
stored again) adds no attempt.

The driver comes from the host's probes: a fake `nvidia-smi` first on the workers' PATH prints a
captured output (tests/fixtures/hosts/*/nvidia-smi.txt, see SOURCES.md there): an A10 on 550.127.05,
then an H100 on 590.48.01. The benchmark itself is the CPU smoke image, as in every scheduler test.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import text

from airflow_cluster import LocalAirflow
from fleet_configs import smoke_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.scheduler]

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
DRIVER_A, DRIVER_B = "550.127.05", "590.48.01"
OUTPUT_A, OUTPUT_B = HOSTS / "a10-550-cuda12.4" / "nvidia-smi.txt", HOSTS / "h100-590-cuda13.1" / "nvidia-smi.txt"
NIGHTS = "logical_date < '2026-11-04'"  # a scheduled run of tonight may also happen: the DAG is unpaused


def fake_nvidia_smi(folder: Path, output: Path) -> Path:
    """`nvidia-smi` printing the captured table named in `folder/current` (other arguments: exit 2, as an
    unknown option does, so the facts come from the table)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "current").write_text(str(output))
    script = folder / "nvidia-smi"
    script.write_text('#!/bin/sh\n[ "$#" -eq 0 ] || exit 2\nexec cat "$(cat "$(dirname "$0")/current")"\n')
    script.chmod(0o755)
    return folder


def attempts(engine) -> list[tuple]:
    """(night, case, attempt, driver, current) of every attempt of the three nights."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            f"select substr(cast(logical_date as varchar), 1, 10), case_key, attempt, driver_version, 1 "
            f"from benchmark_results where {NIGHTS} union all "
            f"select substr(cast(logical_date as varchar), 1, 10), case_key, attempt, driver_version, 0 "
            f"from superseded_results where {NIGHTS} order by 1, 2, 3"))]


def api(airflow: LocalAirflow, method: str, path: str, body: dict, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(f"http://127.0.0.1:{airflow.port}{path}", method=method, headers=headers,
                                 data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}") from None


def clear_tasks(airflow: LocalAirflow, run_id: str, task_ids: list[str]) -> None:
    """What the UI's Clear of these tasks of a run does (the public REST API, as the simple auth manager's admin)."""
    password = json.loads((airflow.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    token = api(airflow, "POST", "/auth/token", {"username": "admin", "password": password})["access_token"]
    cleared = api(airflow, "POST", "/api/v2/dags/fleet_benchmark/clearTaskInstances",
                  {"dry_run": False, "dag_run_id": run_id, "task_ids": task_ids, "only_failed": False,
                   "reset_dag_runs": True}, token)
    assert sorted(ti["task_id"] for ti in cleared["task_instances"]) == sorted(task_ids), cleared


def night3_stored_at(engine):
    with engine.connect() as conn:
        return conn.execute(text("select max(stored_at) from benchmark_results "
                                 "where logical_date >= '2026-11-03' and logical_date < '2026-11-04'")).scalar()


def wait_until(check, airflow: LocalAirflow, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in airflow.runs("fleet_benchmark") if r["run_type"] == "backfill"]
        if check() and all(r["state"] in ("success", "failed") for r in runs):
            return
        time.sleep(2)
    raise TimeoutError(f"the warehouse did not get there in {timeout} s: {airflow.runs('fleet_benchmark')}\n"
                       f"{airflow.logs()}")


def test_backfill_on_a_new_driver_adds_attempts(tmp_path, pg_url, smoke_image, docker_api, monkeypatch, capsys):
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8, 16), num_batches=5)
    config = write_config(tmp_path / "fleet.yaml", cfg)
    warehouse = f"sqlite:///{tmp_path}/warehouse.db"
    smi = fake_nvidia_smi(tmp_path / "bin", OUTPUT_A)
    env = {"FLEETBENCH_CONFIG": str(config), "FLEETBENCH_WAREHOUSE_URL": warehouse,
           "FLEETBENCH_DATA_DIR": str(tmp_path / "data"), "PATH": f"{smi}:{os.environ['PATH']}"}
    from fleetbench.regression import assess_run
    from fleetbench.warehouse import get_engine

    engine = get_engine(warehouse)
    with LocalAirflow(tmp_path / "airflow", pg_url, env=env) as airflow:
        airflow.import_pools(config)
        airflow.wait_for_dag("fleet_benchmark")
        nights = ("backfill", "create", "--dag-id", "fleet_benchmark", "--from-date", "2026-11-01T00:00:00",
                  "--to-date", "2026-11-03T12:00:00")
        airflow.cli(*nights, "--reprocess-behavior", "failed")
        runs = airflow.wait_for_runs("fleet_benchmark", 3, timeout=900, run_type="backfill")
        assert [r["state"] for r in runs] == ["success"] * 3, airflow.logs()
        before = attempts(engine)
        assert [(a[2], a[3], a[4]) for a in before] == [(1, DRIVER_A, 1)] * 6, before  # 3 nights x 2 cases
        airflow.wait_for_backfills()

        # The driver upgrade, then the same nights measured again.
        (smi / "current").write_text(str(OUTPUT_B))
        airflow.cli(*nights, "--reprocess-behavior", "completed")
        wait_until(lambda: len(attempts(engine)) == 12, airflow)
        assert all(r["state"] == "success" for r in airflow.runs("fleet_benchmark") if r["run_type"] == "backfill")
        after = attempts(engine)
        for night in ("2026-11-01", "2026-11-02", "2026-11-03"):
            for case in {a[1] for a in before}:
                assert [(a[2], a[3], a[4]) for a in after if a[:2] == (night, case)] == [
                    (1, DRIVER_A, 0), (2, DRIVER_B, 1)], after
        airflow.wait_for_backfills()

        # Collect and store of one night run again (the same container outcomes): no attempt is added.
        stored_at = night3_stored_at(engine)
        clear_tasks(airflow, "backfill__2026-11-03T02:00:00+00:00", ["store"])
        wait_until(lambda: night3_stored_at(engine) != stored_at, airflow, timeout=600)
        assert attempts(engine) == after

    # The before/after of the upgrade, per case, from the same nights.
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", warehouse)
    from fleetbench.cli import main

    assert main(["compare", "--before", DRIVER_A, "--after", DRIVER_B, "--attempts", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and {r["case_key"] for r in rows} == {a[1] for a in before}
    for r in rows:
        assert (r["before_driver_version"], r["after_driver_version"]) == (DRIVER_A, DRIVER_B)
        assert r["before_n"] >= 3 and r["after_n"] >= 3  # the three nights (and tonight's run, if it happened)
        assert r["before_value"] > 0 and r["after_value"] > 0 and r["metric"] == "images_per_sec"
    assert main(["results", "--attempts", "--all"]) == 0
    assert "1 (superseded)" in capsys.readouterr().out
    # Each attempt keeps the host check it ran under: A's nights were checked on driver A, B's on driver B.
    assert main(["results", "--attempts", "--all", "--format", "json"]) == 0
    checks = {(r["logical_date"][:10], r["attempt"], r["current"], r["host_driver_version"], r["host_verdict"])
              for r in json.loads(capsys.readouterr().out) if r["logical_date"][:10] in ("2026-11-01", "2026-11-02",
                                                                                             "2026-11-03")}
    assert {c[:4] for c in checks} == {(night, 1, False, DRIVER_A) for night in ("2026-11-01", "2026-11-02",
                                                                                   "2026-11-03")} | {
        (night, 2, True, DRIVER_B) for night in ("2026-11-01", "2026-11-02", "2026-11-03")}, checks
    assert all(c[4] is not None for c in checks)

    # The regression detector reads current attempts only: night 3 has two earlier nights (B's), not four.
    with engine.connect() as conn:
        night3 = conn.execute(text("select run_id from runs where logical_date >= '2026-11-03' "
                                   "and logical_date < '2026-11-04'")).scalar()
    assessed = assess_run(engine, "fleet_benchmark", night3)  # min_history 3
    assert assessed.checked == 0 and len(assessed.insufficient_history) == 2
    # No container of these nights is left running (other people's runs on this engine may be).
    from fleetbench.runs import run_token

    ours = {run_token("fleet_benchmark", f"backfill__2026-11-0{n}T02:00:00+00:00") for n in (1, 2, 3)}
    running = docker_api.containers(filters={"label": "org.fleetbench.dag_id=fleet_benchmark", "status": "running"})
    assert [c["Names"] for c in running if any(f"fb-{t}-" in n for t in ours for n in c["Names"])] == []
