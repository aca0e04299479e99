"""Multi-node cases of layout launcher (torch_synthetic under torchrun): config fields and errors, the roles and
the torchrun command of each host, the one rendezvous port, each role's end from real torchrun logs, and the
efficiency across nodes (only when the processes per node match the 1-node case's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetbench import multinode
from fleetbench.config import ConfigError, parse_config
from fleetbench.plan import expand_cases

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "torch-launcher"  # a real 2-node gloo run, resnet18
SCRIPT = ["python3", "/opt/fleetbench/torch_synthetic.py"]


def config(device="cpu", **bench) -> dict:
    gpu = device == "gpu"
    return {
        "hosts": [{"name": h, "address": f"10.0.0.{i + 1}", "connection": f"ssh_{h}"}
                  for i, h in enumerate(("a", "b", "c"))],
        "images": [{"name": "pt", "ref": "127.0.0.1:5000/pt:1", "command": SCRIPT}],
        "benchmarks": [{"name": "ddp", "image": "pt", "harness": "torch_synthetic", "models": ["resnet18"],
                        "batch_sizes": [32], "num_gpus": [1, 2] if gpu else [0], "device": device,
                        "nodes": [1, 2], "layout": "launcher", **bench}],
    }


def errors_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.errors


def test_launcher_config_errors_name_the_field():
    assert errors_of(config(ps_per_node=2, workers_per_node=2)) == [
        "benchmarks[0].ps_per_node: a field of layout ps_worker; layout launcher runs procs_per_node ranks per host",
        "benchmarks[0].workers_per_node: a field of layout ps_worker; layout launcher runs procs_per_node ranks "
        "per host"]
    assert errors_of(config(backend="nccl")) == ["benchmarks[0].backend: nccl needs GPUs; device cpu runs gloo"]
    assert errors_of(config(device="gpu", procs_per_node=4)) == [
        "benchmarks[0].procs_per_node: GPU cases run one rank per GPU (the case's num_gpus); procs_per_node is for "
        "device cpu"]
    assert errors_of(config(procs_per_node=0)) == ["benchmarks[0].procs_per_node: must be >= 1, got 0"]
    assert errors_of(config(backend="mpi"))[0].startswith("benchmarks[0].backend: ")
    data = config(harness="tf_cnn_benchmarks")
    for field in ("harness",):
        data["benchmarks"][0].pop(field)
    assert errors_of(data) == [
        "benchmarks[0].layout: launcher runs harness torch_synthetic (under torchrun), not 'tf_cnn_benchmarks'"]
    ps_worker = config(layout="ps_worker", procs_per_node=2)
    assert ("benchmarks[0].procs_per_node: a field of layout launcher; this benchmark's layout is ps_worker"
            in errors_of(ps_worker))
    cfg = parse_config(config(procs_per_node=2, backend="gloo"))  # fine
    # a dumped config (what the run's parameters are applied to) carries every field at its default: still fine
    assert parse_config(cfg.model_dump(mode="json")) == cfg
    tf = config(layout="ps_worker", ps_per_node=2)
    tf["benchmarks"][0].pop("harness")
    ps_worker = parse_config(tf)
    assert parse_config(ps_worker.model_dump(mode="json")) == ps_worker
    parse_config(config(device="gpu", backend="gloo"))  # gloo also runs on GPUs


def test_launcher_plans_a_node_per_host_with_its_ranks_and_the_backend():
    cases = [c for c in expand_cases(parse_config(config(procs_per_node=2))) if c.nodes == 2]
    [case] = cases  # hosts a, b (c is left over)
    assert case.case_key == "ddp.resnet18.bs32.g0.fp32.nchw.eager.n2.a+b"
    assert case.roles == [{"host": "a", "job": "node", "task_index": 0, "procs": 2},
                          {"host": "b", "job": "node", "task_index": 1, "procs": 2}]
    assert case.cluster["layout"] == "launcher" and case.cluster["backend"] == "gloo"
    assert [multinode.role_name(r) for r in case.roles] == ["node0", "node1"]
    assert [multinode.is_chief(r) for r in case.roles] == [True, False]
    assert all(multinode.runs_to_the_end(r) for r in case.roles)
    # GPU cases: one rank per GPU of the case, nccl by default
    gpu = {c.num_gpus: c for c in expand_cases(parse_config(config(device="gpu"))) if c.nodes == 2}
    assert {g: [r["procs"] for r in c.roles] for g, c in gpu.items()} == {1: [1, 1], 2: [2, 2]}
    assert gpu[2].cluster["backend"] == "nccl"



def test_the_global_batch_of_a_launcher_case_counts_every_rank():
    [cpu] = [c for c in expand_cases(parse_config(config(procs_per_node=2))) if c.nodes == 2]
    assert cpu.batch_size_global == 32 * 2 * 2
    gpu = {c.nodes: c for c in expand_cases(parse_config(config(device="gpu", batch_sizes=[64], num_gpus=[8])))}
    assert (gpu[1].batch_size_global, gpu[2].batch_size_global) == (64 * 8, 64 * 8 * 2)  # 8 ranks per host
    # the real 2-rank run: batch 4 per rank, and its images/sec is the group's (4 x 2 per step)
    assert "x2 ranks model resnet18 batch 4 per rank" in (LOGS / "node0.log").read_text()
    [real] = [c for c in expand_cases(parse_config(config(batch_sizes=[4]))) if c.nodes == 2]
    assert real.batch_size_global == 4 * 2

def test_torchrun_command_of_each_host():
    roles = multinode.launcher_layout(["a", "b"], 2)
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2"}
    flags = ["--model=resnet18", "--batch_size=32"]
    cluster = {"layout": "launcher", "backend": "gloo"}
    assert [multinode.role_command([*SCRIPT, *flags], roles, [29500], addresses, r, cluster) for r in roles] == [
        ["python3", "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={i}", "--nproc_per_node=2",
         "--master_addr=10.0.0.1", "--master_port=29500", "/opt/fleetbench/torch_synthetic.py", *flags,
         "--dist_backend=gloo"] for i in (0, 1)]
    # another launcher in front (not a Python interpreter): torchrun runs it as it is
    assert multinode.role_command(["/opt/run.sh", "--x=1"], roles, [29500], addresses, roles[1],
                                  {"layout": "launcher", "backend": "nccl"}) == [
        "torchrun", "--nnodes=2", "--node_rank=1", "--nproc_per_node=2", "--master_addr=10.0.0.1",
        "--master_port=29500", "--no-python", "/opt/run.sh", "--x=1", "--dist_backend=nccl"]
    assert multinode.role_command(["/usr/bin/python3.11", "t.py"], roles, [1], addresses, roles[0], cluster)[:3] == [
        "/usr/bin/python3.11", "-m", "torch.distributed.run"]
    # only node 0 (the rendezvous) gets a port; a ps_worker case gets one per role
    assert multinode.port_roles(roles, "launcher") == roles[:1]
    ps = multinode.layout(["a", "b"], 1, 1)
    assert multinode.port_roles(ps, "ps_worker") == ps
    assert multinode.joined_marker("launcher") == "joined process group: rank 0 of"
    assert multinode.joined_marker("ps_worker") == "Running warm up"


def test_each_node_of_a_real_torchrun_job_ends_ok_and_node0_gives_the_groups_result(tmp_path):
    from fleetbench.measure import measure

    node0, node1 = multinode.launcher_layout(["a", "b"], 1)
    ends = [multinode.classify_role(r, {"exit_code": 0, "log_path": str(LOGS / f"node{i}.log")}, "torch_synthetic")
            for i, r in enumerate((node0, node1))]
    assert [(e.status, e.failure_class) for e in ends] == [("ok", None), ("ok", None)]  # node1 prints no result
    fields, steps = measure({"command": ["x"], "harness": "torch_synthetic"},
                            {"exit_code": 0, "log_path": str(LOGS / "node0.log")})
    assert (fields["status"], fields["images_per_sec"], len(steps)) == ("ok", pytest.approx(17.6799103), 3)
    assert multinode.LAUNCHER_JOINED_MARKER in (LOGS / "node0.log").read_text()
    # node1 killed mid-run: its own class, and the case's peer_failed naming it
    end = multinode.classify_role(node1, {"exit_code": 137, "log_path": str(LOGS / "node1.log")}, "torch_synthetic")
    assert (end.status, end.failure_class) == ("failed", "killed")
    assert multinode.peer_failure(end)[1].startswith("node1 on b failed (killed: killed by SIGKILL (exit 137)")
    # node 0 must print the result: an exit 0 without one is no_result
    empty = tmp_path / "node0.log"
    empty.write_text((LOGS / "node1.log").read_text())
    assert multinode.classify_role(node0, {"exit_code": 0, "log_path": str(empty)},
                                   "torch_synthetic").failure_class == "no_result"


def test_efficiency_of_a_launcher_row_needs_the_same_processes_per_node():
    from fleetbench.metrics import derive

    def row(host, case_key, ips, nodes=1, host_set=None, procs=None):
        roles = (json.dumps([{"role": f"node{i}", "host": h, "job": "node", "task_index": i, "procs": procs}
                             for i, h in enumerate(host_set.split(","))]) if host_set else None)
        return {"dag_id": "d", "run_id": "r", "host": host, "case_key": case_key, "status": "ok",
                "harness": "torch_synthetic", "model": "resnet18", "batch_size_per_device": 4, "num_gpus": 0,
                "device": "cpu", "precision": "fp32", "images_per_sec": ips, "nodes": nodes, "host_set": host_set,
                "roles_json": roles, "command": ["x"]}

    rows = derive([row("a", "k", 20.0), row("b", "k", 30.0), row("a", "k.n2.a+b", 40.0, 2, "a,b", procs=1),
                   row("a", "p.n2.a+b", 70.0, 2, "a,b", procs=2)], [], None, None)
    got = {r["case_key"]: (r["node_efficiency"], r["node_baseline_images_per_sec"]) for r in rows}
    assert got["k.n2.a+b"] == pytest.approx((40.0 / (2 * 25.0), 25.0))
    assert got["p.n2.a+b"] == (None, None)  # 2 ranks per host: no 1-node case runs 2 processes
