"""One benchmark at a time per host, hosts in parallel: a real scheduler with the LocalExecutor
(`dags test` ignores pools), judged by the containers' own start and finish times."""

from __future__ import annotations

from datetime import datetime

import pytest

from airflow_cluster import LocalAirflow
from fleet_configs import smoke_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.scheduler]


def intervals(rows):
    return sorted((datetime.fromisoformat(r["started_at"]), datetime.fromisoformat(r["finished_at"])) for r in rows)


def test_cases_on_one_host_never_overlap_and_hosts_run_in_parallel(tmp_path, pg_url, smoke_image, docker_api):
    """No pools are created (a host added to fleet.yaml without re-importing pools): the night still runs,
    one case at a time per host."""
    cfg = smoke_config(smoke_image, models=("lenet",), batch_sizes=(8, 16, 24), num_batches=80,
                       hosts=[{"name": "lane-a", "connection": "local"}, {"name": "lane-b", "connection": "local"}])
    cfg["fleet"]["schedule"] = None  # only the run this test triggers
    config = write_config(tmp_path / "fleet.yaml", cfg)
    warehouse = f"sqlite:///{tmp_path}/warehouse.db"
    env = {"FLEETBENCH_CONFIG": str(config), "FLEETBENCH_WAREHOUSE_URL": warehouse,
           "FLEETBENCH_DATA_DIR": str(tmp_path / "data")}

    with LocalAirflow(tmp_path / "airflow", pg_url, env=env) as airflow:
        listed = airflow.cli("pools", "list", "-o", "plain").stdout
        assert "fleetbench_lane" not in listed
        airflow.wait_for_dag("fleet_benchmark")
        airflow.trigger("fleet_benchmark", run_id="lanes-test")
        [run] = airflow.wait_for_runs("fleet_benchmark", 1, timeout=400)
        assert run["state"] == "success", airflow.logs()

    from fleetbench.warehouse import fetch_results, get_engine

    rows = fetch_results(get_engine(warehouse), run_id="lanes-test")
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows), rows
    by_host = {h: intervals([r for r in rows if r["host"] == h]) for h in ("lane-a", "lane-b")}
    for host, spans in by_host.items():
        for (_, end), (next_start, _) in zip(spans, spans[1:]):
            assert end <= next_start, f"cases on {host} overlapped: {spans}"
    overlaps = [(a, b) for a in by_host["lane-a"] for b in by_host["lane-b"] if a[0] < b[1] and b[0] < a[1]]
    assert overlaps, f"the two hosts never ran at the same time: {by_host}"
    assert docker_api.containers(all=True, filters={"label": "org.fleetbench.run_id=lanes-test"}) == []
