"""Multi-node cases with the real upstream tf_cnn_benchmarks (TensorFlow 2.15.1 CPU, baked from git by fleetbench's
bake step): two fleet hosts on this machine's engine (distinct names, loopback addresses 127.0.0.1 and
127.0.0.2), one parameter server and two workers over host networking, through fleet_benchmark.

- the 2-node case stores one row: the cluster's total images/sec (the chief's), its hosts and roles, and its
  efficiency against the 1-node rows of the same model and batch;
- a worker killed mid-run: every container of the case is gone, the row is failed `peer_failed` (naming the
  worker), every role's log is kept, and the night's 1-node cases are unaffected;
- a port already taken: the case's roles get other ports and it runs; no free port at all: `port_unavailable`;
- a host address its peers cannot reach: the chief never joins, `rendezvous_timeout`.

Skipped, saying why, without the benchmarks' git repository (conftest `tf_benchmarks_git`)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from fleet_configs import containers_of, real_tf_config, run_fleet_dag, write_config

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

HOSTS = [{"name": "node-a", "connection": "local", "address": "127.0.0.1"},
         {"name": "node-b", "connection": "local", "address": "127.0.0.2"}]
# One ps (on the set's first host) and one worker per host: the runbook's ps/worker cluster, 1 ps + 2 workers.
CLUSTER = {"nodes": [1, 2], "variable_update": ["parameter_server"], "ps_per_node": 1, "ps_nodes": "first",
           "workers_per_node": 1, "rendezvous_timeout_s": 240}


def multinode_config(tf_image: str, git_url: str, num_batches: int = 20, **bench) -> dict:
    return real_tf_config(tf_image, git_url, hosts=HOSTS, models=("trivial",), batch_sizes=(8,),
                          num_batches=num_batches, timeout_s=420, **{**CLUSTER, **bench})


def rows_of(run_id: str) -> dict:
    """(host, nodes) -> row of a run with one model."""
    from fleetbench.warehouse import fetch_results, get_engine

    engine = get_engine()
    try:
        return {(r["host"], r["nodes"]): r for r in fetch_results(engine, run_id=run_id)}
    finally:
        engine.dispose()


def test_ps_and_two_workers_on_two_hosts_store_one_row_with_efficiency(airflow_db, data_dir, tf_image,
                                                                        tf_benchmarks_git, docker_api, tmp_path,
                                                                        monkeypatch):
    """trivial at batch 8 and resnet50 at batch 2, each on one host and on both (1 ps + 2 workers)."""
    base_port = 24310
    cfg = multinode_config(tf_image, tf_benchmarks_git, base_port=base_port)
    cfg["benchmarks"].append({**cfg["benchmarks"][0], "name": "tf-r50", "models": ["resnet50"], "batch_sizes": [2],
                              "num_batches": 10, "base_port": base_port + 20})
    with socket.socket() as taken:  # the case's first port is taken: its roles move on to free ones
        taken.bind(("127.0.0.1", base_port))
        taken.listen()
        dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    assert dag_run.state == "success"
    from fleetbench.warehouse import fetch_results, get_engine

    every = {(r["model"], r["host"], r["nodes"]): r for r in fetch_results(get_engine(), run_id=dag_run.run_id)}
    assert set(every) == {(m, h, n) for m in ("trivial", "resnet50") for h, n in
                          (("node-a", 1), ("node-b", 1), ("node-a", 2))}
    for key, row in every.items():
        assert row["status"] == "ok", (key, row["failure_class"], row["failure_detail"])
    for model, batch in (("trivial", 8), ("resnet50", 2)):
        multi, one_a, one_b = (every[(model, "node-a", 2)], every[(model, "node-a", 1)],
                               every[(model, "node-b", 1)])
        bench = "tf" if model == "trivial" else "tf-r50"
        assert multi["case_key"] == f"{bench}.{model}.bs{batch}.g0.parameter_server.n2.node-a+node-b"
        assert multi["host_set"] == "node-a,node-b" and one_a["host_set"] is None and one_a["nodes"] == 1
        roles = {r["role"]: r for r in json.loads(multi["roles_json"])}
        assert {n: (r["host"], r["job"], r["address"]) for n, r in roles.items()} == {
            "worker0": ("node-a", "worker", "127.0.0.1"), "worker1": ("node-b", "worker", "127.0.0.2"),
            "ps0": ("node-a", "ps", "127.0.0.1")}
        assert roles["ps0"]["stopped"] is True and roles["worker1"]["exit_code"] == 0  # a ps never exits by itself
        command = json.loads(multi["command"])
        ports = {a.split(":")[1] for flag in command if flag.startswith(("--ps_hosts=", "--worker_hosts="))
                 for a in flag.split("=", 1)[1].split(",")}
        assert "--job_name=worker" in command and "--task_index=0" in command and len(ports) == 3
        assert str(base_port) not in ports  # taken: skipped
        assert "--ps_hosts=127.0.0.1:" in " ".join(command) and "127.0.0.2:" in " ".join(command)
        # The chief is worker task 0 of the cluster, and its total images/sec is the row's; worker1 is task 1.
        chief_log = open(multi["log_path"], encoding="utf-8", errors="replace").read()
        assert "/job:worker/replica:0/task:0/cpu:0" in chief_log and "total images/sec:" in chief_log
        assert f"Batch size:  {2 * batch} global" in chief_log  # two workers
        worker1_log = open(roles["worker1"]["log_path"], encoding="utf-8", errors="replace").read()
        assert "/job:worker/replica:0/task:1/cpu:0" in worker1_log
        assert "total images/sec:" not in open(roles["ps0"]["log_path"], encoding="utf-8", errors="replace").read()
        baseline = (one_a["images_per_sec"] + one_b["images_per_sec"]) / 2
        assert multi["node_baseline_images_per_sec"] == pytest.approx(baseline)
        assert multi["node_efficiency"] == pytest.approx(multi["images_per_sec"] / (2 * baseline))
        assert 0.01 < multi["node_efficiency"] < 5.0
        print(f"\nreal 2-node {model} bs{batch}: {multi['images_per_sec']:.2f} images/sec total, 1-node "
              f"{one_a['images_per_sec']:.2f} / {one_b['images_per_sec']:.2f}, efficiency "
              f"{multi['node_efficiency']:.3f}")
    assert containers_of(docker_api, dag_run.run_id) == []


def kill_worker_when_training(docker_api, stop: threading.Event, killed: list) -> None:
    """Kill worker1's container once the chief's cluster trains (its step lines): a peer dying mid-run."""
    while not stop.is_set():
        for c in docker_api.containers(filters={"label": "org.fleetbench.role=worker1"}):
            if b"images/sec" in docker_api.logs(c["Id"], tail=50) or b"Running warm up" in docker_api.logs(c["Id"]):
                docker_api.kill(c["Id"])
                killed.append(time.monotonic())
                return
        time.sleep(0.3)


def test_a_worker_killed_mid_run_fails_the_case_peer_failed_and_removes_every_container(
        airflow_db, data_dir, tf_image, tf_benchmarks_git, docker_api, tmp_path, monkeypatch):
    config = write_config(tmp_path / "fleet.yaml", multinode_config(tf_image, tf_benchmarks_git, num_batches=400))
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=kill_worker_when_training, args=(docker_api, stop, killed), daemon=True)
    watcher.start()
    try:
        dag_run = run_fleet_dag(monkeypatch, config, run_conf=None)
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert killed, "worker1 never started training"
    rows = rows_of(dag_run.run_id)
    multi = rows[("node-a", 2)]
    assert (multi["status"], multi["failure_class"]) == ("failed", "peer_failed")
    assert multi["failure_detail"].startswith("worker1 on node-b failed (killed")
    assert multi["images_per_sec"] is None and multi["node_efficiency"] is None
    roles = {r["role"]: r for r in json.loads(multi["roles_json"])}
    assert roles["worker1"]["failure_class"] == "killed" and roles["worker1"]["exit_code"] == 137
    assert roles["worker0"]["stopped"] and roles["ps0"]["stopped"]
    for r in roles.values():  # every role's log is kept
        assert open(r["log_path"], encoding="utf-8", errors="replace").read().strip()
    # the night's other cases ran as usual, and no container of the run is left
    assert [rows[(h, 1)]["status"] for h in ("node-a", "node-b")] == ["ok", "ok"]
    assert containers_of(docker_api, dag_run.run_id) == []


def test_no_free_port_is_port_unavailable_and_an_unreachable_peer_is_rendezvous_timeout(
        airflow_db, data_dir, tf_image, tf_benchmarks_git, docker_api, tmp_path, monkeypatch):
    from fleetbench.multinode import PORT_TRIES

    cfg = multinode_config(tf_image, tf_benchmarks_git, nodes=[2], rendezvous_timeout_s=20, base_port=24510)
    # node-b's address is not this machine's (TEST-NET-1): the chief waits for worker1 there and never joins
    cfg["hosts"][1]["address"] = "192.0.2.1"
    # a second benchmark on the same hosts whose every port is taken on node-a
    cfg["benchmarks"].append({**cfg["benchmarks"][0], "name": "tfp", "base_port": 24600})
    sockets = []
    try:
        for port in range(24600, 24600 + PORT_TRIES):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            sockets.append(sock)
        dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    finally:
        for sock in sockets:
            sock.close()
    from fleetbench.warehouse import fetch_results, get_engine

    rows = {r["benchmark"]: r for r in fetch_results(get_engine(), run_id=dag_run.run_id)}
    assert (rows["tf"]["status"], rows["tf"]["failure_class"]) == ("failed", "rendezvous_timeout")
    assert "within 20 s" in rows["tf"]["failure_detail"]
    roles = {r["role"]: r for r in json.loads(rows["tf"]["roles_json"])}
    assert all(r["stopped"] for r in roles.values())  # nobody failed on its own: all were stopped
    assert (rows["tfp"]["status"], rows["tfp"]["failure_class"]) == ("failed", "port_unavailable")
    assert rows["tfp"]["failure_detail"].startswith("no free port for worker0 on node-a (127.0.0.1) in 24600..")
    assert containers_of(docker_api, dag_run.run_id) == []
