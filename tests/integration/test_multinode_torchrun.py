"""Multi-node cases of layout launcher: the real torch_synthetic training loop (fleetbench/torch-cpu) under torchrun
with the gloo backend on two fleet hosts of this machine's engine (distinct names, loopback addresses 127.0.0.1 and
127.0.0.2), one rank per host, over host networking, through fleet_benchmark.

- the 2-node case stores one row: the group's total images/sec (node 0's), its hosts and roles, and its efficiency
  against the 1-node rows of the same model and batch;
- node 1 killed mid-run: every container of the case is gone, the row is failed `peer_failed` naming node1, and
  every role's log is kept."""

from __future__ import annotations

import json
import threading
import time

import pytest

from fleet_configs import containers_of, run_fleet_dag, write_config

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

TORCH_IMAGE = "fleetbench/torch-cpu:latest"  # include/images/torch-cpu/build.sh (make images), local only
HOSTS = [{"name": "node-a", "connection": "local", "address": "127.0.0.1"},
         {"name": "node-b", "connection": "local", "address": "127.0.0.2"}]


@pytest.fixture(scope="module")
def torch_image(docker_api) -> str:
    try:
        docker_api.inspect_image(TORCH_IMAGE)
    except Exception as exc:
        pytest.fail(f"{TORCH_IMAGE} is not built ({exc}); run `make images`, which builds it")
    return TORCH_IMAGE


def launcher_config(nodes=(1, 2), num_batches: int = 4, base_port: int = 24710, **bench) -> dict:
    """resnet18 on 32x32 synthetic images, batch 4 per rank: small enough for a shared 2-core machine."""
    return {
        "fleet": {"name": "test", "timezone": "UTC", "schedule": "0 2 * * *"},
        "hosts": HOSTS,
        "images": [{"name": "torch-cpu", "ref": TORCH_IMAGE, "pull_policy": "never",
                    "command": ["python3", "/opt/fleetbench/torch_synthetic.py"]}],
        "benchmarks": [{
            "name": "ddp", "image": "torch-cpu", "harness": "torch_synthetic", "device": "cpu", "num_gpus": [0],
            "models": ["resnet18"], "batch_sizes": [4], "num_batches": num_batches, "num_warmup_batches": 1,
            "timeout_s": 300, "extra_args": ["--image_size=32", "--num_classes=10"], "nodes": list(nodes),
            "layout": "launcher", "procs_per_node": 1, "backend": "gloo", "base_port": base_port,
            "rendezvous_timeout_s": 120, **bench,
        }],
    }


def rows_of(run_id: str) -> dict:
    """(host, nodes) -> row of the run."""
    from fleetbench.warehouse import fetch_results, get_engine

    engine = get_engine()
    try:
        return {(r["host"], r["nodes"]): r for r in fetch_results(engine, run_id=run_id)}
    finally:
        engine.dispose()


def test_torchrun_on_two_hosts_stores_the_groups_total_and_its_efficiency(airflow_db, data_dir, torch_image,
                                                                         docker_api, tmp_path, monkeypatch):
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", launcher_config()))
    assert dag_run.state == "success"
    rows = rows_of(dag_run.run_id)
    assert set(rows) == {("node-a", 1), ("node-b", 1), ("node-a", 2)}
    for key, row in rows.items():
        assert row["status"] == "ok", (key, row["failure_class"], row["failure_detail"])
    multi, one_a, one_b = rows[("node-a", 2)], rows[("node-a", 1)], rows[("node-b", 1)]
    assert multi["case_key"] == "ddp.resnet18.bs4.g0.fp32.nchw.eager.n2.node-a+node-b"
    assert (multi["nodes"], multi["host_set"], multi["harness"]) == (2, "node-a,node-b", "torch_synthetic")
    assert multi["images_per_sec"] == multi["value"] > 0 and multi["step_count"] == 4
    roles = {r["role"]: r for r in json.loads(multi["roles_json"])}
    assert {n: (r["host"], r["job"], r["address"], r["procs"], r["exit_code"], r["stopped"])
            for n, r in roles.items()} == {"node0": ("node-a", "node", "127.0.0.1", 1, 0, False),
                                           "node1": ("node-b", "node", "127.0.0.2", 1, 0, False)}
    command = json.loads(multi["command"])
    assert command[:6] == ["python3", "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=0",
                           "--nproc_per_node=1"]
    assert "--master_addr=127.0.0.1" in command and "--dist_backend=gloo" in command
    port = next(int(a.split("=")[1]) for a in command if a.startswith("--master_port="))
    assert 24710 <= port < 24710 + 64
    # node 0's log is the group's: every rank joined over gloo, per-rank batch x 2 ranks; node 1 prints no result
    chief_log = open(multi["log_path"], encoding="utf-8", errors="replace").read()
    assert "joined process group: rank 0 of 2 backend gloo" in chief_log and "batch 4 per rank" in chief_log
    node1_log = open(roles["node1"]["log_path"], encoding="utf-8", errors="replace").read()
    assert "Rank 1 is connected to 1 peer ranks" in node1_log and "images_per_sec" not in node1_log
    baseline = (one_a["images_per_sec"] + one_b["images_per_sec"]) / 2
    assert multi["node_baseline_images_per_sec"] == pytest.approx(baseline)
    assert multi["node_efficiency"] == pytest.approx(multi["images_per_sec"] / (2 * baseline))
    assert 0.01 < multi["node_efficiency"] < 5.0
    print(f"\nreal 2-node torchrun resnet18 bs4 (32x32, gloo): {multi['images_per_sec']:.2f} images/sec total, "
          f"1-node {one_a['images_per_sec']:.2f} / {one_b['images_per_sec']:.2f}, "
          f"efficiency {multi['node_efficiency']:.3f}")
    assert containers_of(docker_api, dag_run.run_id) == []


def kill_node1_when_training(docker_api, stop: threading.Event, killed: list) -> None:
    """Kill node1's container once node 0 prints step lines: a rank dying mid-run."""
    while not stop.is_set():
        chief = docker_api.containers(filters={"label": "org.fleetbench.role=node0"})
        node1 = docker_api.containers(filters={"label": "org.fleetbench.role=node1"})
        if chief and node1 and b"images/sec loss" in docker_api.logs(chief[0]["Id"], tail=20):
            docker_api.kill(node1[0]["Id"])
            killed.append(time.monotonic())
            return
        time.sleep(0.3)


def test_a_rank_killed_mid_run_fails_the_case_peer_failed_and_removes_every_container(
        airflow_db, data_dir, torch_image, docker_api, tmp_path, monkeypatch):
    config = write_config(tmp_path / "fleet.yaml", launcher_config(nodes=(2,), num_batches=2000, base_port=24790))
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=kill_node1_when_training, args=(docker_api, stop, killed), daemon=True)
    watcher.start()
    try:
        dag_run = run_fleet_dag(monkeypatch, config)
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert killed, "node 0 never started training"
    multi = rows_of(dag_run.run_id)[("node-a", 2)]
    assert (multi["status"], multi["failure_class"]) == ("failed", "peer_failed")
    assert multi["failure_detail"].startswith("node1 on node-b failed (killed: killed by SIGKILL (exit 137)")
    assert multi["images_per_sec"] is None and multi["node_efficiency"] is None
    roles = {r["role"]: r for r in json.loads(multi["roles_json"])}
    assert roles["node1"]["failure_class"] == "killed" and roles["node1"]["exit_code"] == 137
    assert roles["node0"]["stopped"] is True  # node 0 waited on its dead peer: fleetbench stopped it
    for r in roles.values():  # every role's log is kept
        assert open(r["log_path"], encoding="utf-8", errors="replace").read().strip()
    assert containers_of(docker_api, dag_run.run_id) == []


def test_a_rendezvous_that_never_completes_is_rendezvous_timeout(airflow_db, data_dir, torch_image, docker_api,
                                                                 tmp_path, monkeypatch):
    cfg = launcher_config(nodes=(2,), base_port=24870, rendezvous_timeout_s=10)
    # node-a's address is not this machine's (TEST-NET-1): node 1 never reaches the rendezvous, node 0 waits
    cfg["hosts"] = [{**HOSTS[0], "address": "192.0.2.1"}, HOSTS[1]]
    dag_run = run_fleet_dag(monkeypatch, write_config(tmp_path / "fleet.yaml", cfg))
    multi = rows_of(dag_run.run_id)[("node-a", 2)]
    assert (multi["status"], multi["failure_class"]) == ("failed", "rendezvous_timeout")
    assert multi["failure_detail"].startswith(
        "the chief did not join the cluster (no 'joined process group: rank 0 of' line) within 10 s")
    assert "--master_addr=192.0.2.1" in json.loads(multi["command"])
    roles = {r["role"]: r for r in json.loads(multi["roles_json"])}
    assert set(roles) == {"node0", "node1"} and all(r["stopped"] for r in roles.values())
    assert containers_of(docker_api, dag_run.run_id) == []
