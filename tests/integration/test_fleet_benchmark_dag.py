"""fleet_benchmark end to end with dag.test(): real Docker engine, real registry, real warehouse rows."""

from __future__ import annotations

import json

import pytest

from fleet_configs import containers_of, run_fleet_dag, smoke_config, write_config
from fleetbench.metrics import cpu_tdp_w

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]


PRICE_PER_HOUR = 0.25  # the smoke host's example price (USD per hour of the machine)


def test_smoke_fleet_stores_one_ok_row_per_case(airflow_db, data_dir, smoke_image, docker_api, tmp_path, monkeypatch):
    cfg = smoke_config(smoke_image, hosts=[{"name": "localhost", "connection": "local",
                                            "price_per_hour": PRICE_PER_HOUR}])
    config = write_config(tmp_path / "fleet.yaml", cfg)
    dag_run = run_fleet_dag(monkeypatch, config)
    assert dag_run.state == "success"

    from fleetbench.warehouse import fetch_results, get_engine

    engine = get_engine()
    rows = fetch_results(engine, run_id=dag_run.run_id)
    assert sorted((r["model"], r["batch_size_per_device"]) for r in rows) == [
        ("lenet", 8), ("lenet", 16), ("trivial", 8), ("trivial", 16)]
    digest = docker_api.inspect_distribution(smoke_image)["Descriptor"]["digest"]
    for row in rows:
        assert row["status"] == "ok", row
        assert row["failure_class"] is None
        assert row["images_per_sec"] > 0
        assert row["image_digest"] == digest
        assert row["image_ref"] == smoke_image
        assert row["host"] == "localhost" and row["num_gpus"] == 0
        assert row["step_count"] >= 2
        assert row["duration_s"] > 0 and row["started_at"] < row["finished_at"]
        assert json.loads(row["command"])[:2] == ["python3", "/opt/fleetbench/tf_cnn_benchmarks.py"]
        assert f"--batch_size={row['batch_size_per_device']}" in json.loads(row["command"])
        check_cpu_energy_and_cost(row)
    assert containers_of(docker_api, dag_run.run_id) == []

    from sqlalchemy import text

    with engine.connect() as conn:
        steps = conn.execute(text("select count(*) from steps where run_id = :r"), {"r": dag_run.run_id}).scalar()
        facts = conn.execute(text("select verdict, docker_version from host_facts where run_id = :r"),
                             {"r": dag_run.run_id}).all()
        run = conn.execute(text("select cases_total, cases_ok from runs where run_id = :r"),
                           {"r": dag_run.run_id}).one()
    assert steps == sum(r["step_count"] for r in rows)
    assert facts[0][0] == "ready" and facts[0][1]
    assert tuple(run) == (4, 4)
    # each task's result is one XCom: no task also pushes its dict's keys (multiple_outputs), only the lane its
    # verdict and images, and the plan its host's cases (one slice per host: each lane reads its own)
    from airflow.utils.session import create_session

    with create_session() as session:
        keys = {tuple(r) for r in session.execute(text("select task_id, key from xcom where run_id = :r"),
                                                  {"r": dag_run.run_id})}
    assert keys == {("plan", "return_value"), ("plan", "plan.cases.host.localhost"),
                    ("host_localhost.cases", "return_value"),
                    ("host_localhost.cases", "validation"), ("host_localhost.cases", "images"),
                    ("host_localhost.run_case", "return_value"), ("store", "return_value"),
                    ("report", "return_value"), ("outcome", "return_value")}


def check_cpu_energy_and_cost(row: dict) -> None:
    """A CPU case's energy (the host's RAPL counters, else TDP x the container's CPU utilisation) and cost
    (the host's price per hour x its wall time), as the smoke run on this machine stores them."""
    telemetry = json.loads(row["telemetry_json"])
    cpu = telemetry["cpu"]
    assert cpu["count"] >= 1 and cpu["usage_s"] > 0 and cpu["wall_s"] > 0, cpu
    assert row["energy_source"] in ("measured", "estimated") and row["energy_j"] > 0, row
    assert row["energy_kwh"] == pytest.approx(row["energy_j"] / 3.6e6)
    assert row["mean_power_w"] > 0 and row["images_per_joule"] > 0
    if row["energy_source"] == "estimated":  # no readable RAPL here: it says why
        assert telemetry["rapl"]["reason"]
        assert 0 < row["mean_cpu_util_pct"] <= 100
        # no cpu_tdp_w in the config: CodeCarbon's TDP of the CPU model, else 4 W per logical CPU (as here:
        # this VM's model name is a bare "AMD EPYC")
        tdp, source = cpu_tdp_w(None, cpu["count"], cpu["model"], cpu["sockets"])
        assert row["cpu_tdp_w"] == tdp and (source == "table" or tdp == 4.0 * cpu["count"])
        assert row["energy_j"] == pytest.approx(row["cpu_tdp_w"] * row["mean_cpu_util_pct"] / 100 * row["duration_s"])
    else:
        assert telemetry["rapl"]["energy_j"] == pytest.approx(row["energy_j"]) and row["cpu_tdp_w"] is None
    assert (row["price_per_hour"], row["price_source"], row["price_per_gpu_hour"]) == (PRICE_PER_HOUR, "host_hour",
                                                                                        None)
    assert row["cost_usd"] > 0
    assert row["cost_usd"] == pytest.approx(PRICE_PER_HOUR * row["duration_s"] / 3600)
    assert row["cost_per_million_images_usd"] == pytest.approx(PRICE_PER_HOUR / (3600 * row["images_per_sec"]) * 1e6)


def test_case_failures_are_rows_and_unfit_hosts_are_skipped(airflow_db, data_dir, smoke_image, docker_api, tmp_path,
                                                            monkeypatch):
    """A harness that exits non-zero is a classified row; a host whose engine is gone is skipped; the run goes on."""
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,),
                       hosts=[{"name": "localhost", "connection": "local"},
                              {"name": "ghost", "connection": "local", "docker_url": "unix:///nonexistent/docker.sock"}])
    cfg["benchmarks"].append({"name": "broken", "image": "cpu-smoke", "device": "cpu", "models": ["trivial"],
                              "batch_sizes": [8], "num_gpus": [0], "num_batches": 5, "timeout_s": 60,
                              "extra_args": ["--optimizer=adam"]})  # the smoke harness only knows sgd: exit 2
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "success"

    from fleetbench.warehouse import fetch_results, get_engine

    rows = {(r["host"], r["benchmark"]): r for r in fetch_results(get_engine(), run_id=dag_run.run_id)}
    assert len(rows) == 4
    assert rows[("localhost", "smoke")]["status"] == "ok"
    broken = rows[("localhost", "broken")]
    assert (broken["status"], broken["failure_class"], broken["exit_code"]) == ("failed", "nonzero_exit", 2)
    assert "optimizer" in broken["failure_detail"]
    for bench in ("smoke", "broken"):
        ghost = rows[("ghost", bench)]
        assert (ghost["status"], ghost["failure_class"]) == ("skipped", "host_unfit")
        assert "Docker engine not reachable" in ghost["failure_detail"]
    assert containers_of(docker_api, dag_run.run_id) == []


def test_every_host_unfit_fails_the_run_with_one_message(airflow_db, data_dir, smoke_image, tmp_path, monkeypatch):
    cfg = smoke_config(smoke_image, models=("trivial",), batch_sizes=(8,),
                       hosts=[{"name": "ghost", "connection": "local", "docker_url": "unix:///nonexistent/docker.sock"}])
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "failed"
    from fleetbench.warehouse import fetch_results, get_engine

    rows = fetch_results(get_engine(), run_id=dag_run.run_id)
    assert [(r["host"], r["status"]) for r in rows] == [("ghost", "skipped")]
