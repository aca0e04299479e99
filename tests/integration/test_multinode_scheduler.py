"""A multi-node case holds every host of its set: under a real scheduler (LocalExecutor on PostgreSQL, which
honours parallelism, unlike `dags test`), no container of a 2-node case overlaps a single-node case of
either host, and two 2-node cases on the same two hosts run one after the other (no overlap, no deadlock).

Judged by the containers' own start and finish times: each single-node row's, and each role's of the
multi-node rows (`roles_json`). The real tf_cnn_benchmarks (TensorFlow 2.15.1 CPU, baked from git), one ps
and two workers; skipped, saying why, without the benchmarks' git repository."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from airflow_cluster import LocalAirflow
from fleet_configs import real_tf_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.scheduler]


def span(start: str, end: str) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(start), datetime.fromisoformat(end)


def test_multinode_cases_hold_all_their_hosts_and_never_deadlock(tmp_path, pg_url, tf_image, tf_benchmarks_git,
                                                                 docker_api):
    cfg = real_tf_config(tf_image, tf_benchmarks_git, models=("trivial",), batch_sizes=(8, 16), num_batches=10,
                         timeout_s=420,
                         hosts=[{"name": "sched-a", "connection": "local", "address": "127.0.0.1"},
                                {"name": "sched-b", "connection": "local", "address": "127.0.0.2"}],
                         nodes=[1, 2], ps_per_node=1, ps_nodes="first", workers_per_node=1, base_port=24410)
    cfg["fleet"]["schedule"] = None
    config = write_config(tmp_path / "fleet.yaml", cfg)
    warehouse = f"sqlite:///{tmp_path}/warehouse.db"
    env = {"FLEETBENCH_CONFIG": str(config), "FLEETBENCH_WAREHOUSE_URL": warehouse,
           "FLEETBENCH_DATA_DIR": str(tmp_path / "data")}

    with LocalAirflow(tmp_path / "airflow", pg_url, env=env) as airflow:
        airflow.wait_for_dag("fleet_benchmark")
        airflow.trigger("fleet_benchmark", run_id="multinode-test")
        [run] = airflow.wait_for_runs("fleet_benchmark", 1, timeout=900)
        assert run["state"] == "success", airflow.logs()

    from fleetbench.warehouse import fetch_results, get_engine

    rows = fetch_results(get_engine(warehouse), run_id="multinode-test")
    assert sorted((r["host"], r["nodes"], r["batch_size_per_device"], r["status"]) for r in rows) == [
        ("sched-a", 1, 8, "ok"), ("sched-a", 1, 16, "ok"), ("sched-a", 2, 8, "ok"), ("sched-a", 2, 16, "ok"),
        ("sched-b", 1, 8, "ok"), ("sched-b", 1, 16, "ok")], [(r["case_key"], r["failure_detail"]) for r in rows]
    busy: dict[str, list[tuple[str, tuple[datetime, datetime]]]] = {"sched-a": [], "sched-b": []}
    for r in rows:
        if r["nodes"] == 1:
            busy[r["host"]].append((r["case_key"], span(r["started_at"], r["finished_at"])))
        else:
            roles = json.loads(r["roles_json"])
            assert {x["role"] for x in roles} == {"worker0", "worker1", "ps0"}
            for role in roles:
                busy[role["host"]].append((f"{r['case_key']}:{role['role']}",
                                           span(role["started_at"], role["finished_at"])))
    for host, spans in busy.items():
        for i, (a, (a0, a1)) in enumerate(spans):
            for b, (b0, b1) in spans[i + 1:]:
                same_case = a.split(":")[0] == b.split(":")[0]
                assert same_case or a1 <= b0 or b1 <= a0, f"{a} and {b} overlapped on {host}: {spans}"
    multi = sorted((span(r["started_at"], r["finished_at"]) for r in rows if r["nodes"] == 2))
    assert multi[0][1] <= multi[1][0], f"the two 2-node cases overlapped: {multi}"
    assert all(r["node_efficiency"] is not None for r in rows if r["nodes"] == 2)
    assert docker_api.containers(all=True, filters={"label": "org.fleetbench.run_id=multinode-test"}) == []
