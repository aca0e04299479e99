"""Multi-node cases: config fields and errors, host sets and case keys, role layouts, ports, the cluster spec,
each role's end from real ps/worker logs, the rows' hosts and roles, and the efficiency across nodes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from fleetbench import multinode
from fleetbench.config import ConfigError, config_warnings, parse_config
from fleetbench.plan import build_plan, expand_cases

DIST = Path(__file__).resolve().parents[1] / "fixtures" / "real-tf215-dist"


def config(hosts=("a", "b", "c", "d", "e"), **bench) -> dict:
    return {
        "hosts": [{"name": h, "address": f"10.0.0.{i + 1}", "connection": f"ssh_{h}"} for i, h in enumerate(hosts)],
        "images": [{"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "command": ["python", "/b/tf_cnn_benchmarks.py"]}],
        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50"], "batch_sizes": [64],
                        "num_gpus": [1], "variable_update": ["parameter_server"], "nodes": [1, 2], **bench}],
    }


def errors_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.errors


# -- config ---------------------------------------------------------------------------------------
def test_config_errors_name_the_field():
    errs = errors_of(config(variable_update=["replicated"]))
    assert errs == ["benchmarks[0].variable_update[0]: 'replicated' cannot span hosts (nodes > 1 runs "
                    "parameter_server or distributed_replicated)"]
    assert errors_of(config(variable_update=["distributed_replicated"])) == [
        "benchmarks[0].nodes: 1 with variable_update distributed_replicated (a cluster mode): give the 1-node "
        "baseline its own benchmark (e.g. replicated)"]
    assert errors_of(config(layout="launcher")) == [
        "benchmarks[0].layout: launcher runs harness torch_synthetic (under torchrun), not 'tf_cnn_benchmarks'"]
    assert errors_of(config(nodes=[0])) == ["benchmarks[0].nodes[0]: must be >= 1, got 0"]
    assert errors_of(config(nodes=[2, 2]))[0].startswith("benchmarks[0].nodes: must not repeat a value")
    assert errors_of(config(ps_per_node=-1)) == ["benchmarks[0].ps_per_node: must be >= 0, got -1"]


def test_nccl_tests_cannot_span_hosts():
    data = config(harness="nccl_tests", collectives=["all_reduce"])
    for field in ("models", "batch_sizes", "variable_update"):
        data["benchmarks"][0].pop(field)
    assert ("benchmarks[0].nodes: cases of several hosts (nodes > 1) run harness tf_cnn_benchmarks (layout "
            "ps_worker) or torch_synthetic (layout launcher), not 'nccl_tests'") in errors_of(data)


def test_spanned_hosts_need_an_address_and_no_queue_of_their_own():
    data = config(hosts=("a", "b"))
    data["hosts"][0].pop("address")
    data["hosts"][1]["queue"] = "gpu_b"
    assert errors_of(data) == [
        "hosts[0].address: is required for host 'a' of multi-node benchmark 'cnn' (where the other hosts reach its "
        "containers)",
        "hosts[1].queue: host 'b' runs multi-node benchmark 'cnn', whose containers are started from the default "
        "queue: drive its engine over TLS (docker_url tcp://) instead of a queue of its own"]
    # a local host is reached at 127.0.0.1 unless told otherwise; a host outside the benchmark needs nothing
    ok = config()
    ok["hosts"] = [{"name": "a"}, {"name": "b", "address": "127.0.0.2"}, {"name": "c", "connection": "ssh_c"}]
    ok["benchmarks"][0]["hosts"] = ["a", "b"]
    cfg = parse_config(ok)
    assert [h.cluster_address() for h in cfg.hosts] == ["127.0.0.1", "127.0.0.2", None]
    assert errors_of({**ok, "hosts": [{"name": "a", "address": "not an address!"}, {"name": "b"}]}) == [
        "hosts[0].address: must match ^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$, got 'not an address!'"]


def test_a_local_host_spanned_with_remote_hosts_needs_an_address():
    """127.0.0.1 only works while every host of the benchmark is this machine."""
    data = config(hosts=("a", "b"))
    data["hosts"][0] = {"name": "a"}  # local, no address
    assert errors_of(data) == [
        "hosts[0].address: is required for local host 'a' of multi-node benchmark 'cnn', which also spans remote "
        "hosts (they cannot reach it at 127.0.0.1)"]
    data["hosts"][0]["address"] = "10.0.0.9"
    assert parse_config(data).hosts[0].cluster_address() == "10.0.0.9"


def test_gpu_cases_across_hosts_take_whole_gpus_one_worker_per_host():
    assert errors_of(config(mig_profiles=["1g.10gb"])) == [
        "benchmarks[0].mig_profiles: cases of several hosts (nodes > 1) run on whole GPUs; give the MIG cases a "
        "benchmark of their own"]
    assert errors_of(config(workers_per_node=2)) == [
        "benchmarks[0].workers_per_node: GPU cases run one worker per host with the case's num_gpus GPUs "
        "(several workers on one host would each see every GPU)"]
    parse_config(config(workers_per_node=2, device="cpu", num_gpus=[0]))  # CPU workers share nothing


def test_more_nodes_than_hosts_is_a_warning_and_plans_nothing_of_that_size():
    cfg = parse_config(config(hosts=("a", "b"), nodes=[1, 4]))
    assert config_warnings(cfg) == ["benchmarks[0].nodes: 4 hosts per case, but the benchmark runs on 2 host(s): "
                                    "no case of that size is planned"]
    assert {c.nodes for c in expand_cases(cfg)} == {1}


# -- plan -----------------------------------------------------------------------------------------
def test_host_sets_are_consecutive_disjoint_and_named_by_the_case_key():
    assert multinode.host_sets(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"]]
    assert multinode.host_sets(["a", "b", "c"], 3) == [["a", "b", "c"]]
    assert multinode.host_sets(["a"], 2) == []
    cases = expand_cases(parse_config(config(nodes=[1, 2, 4])))
    one = [c for c in cases if c.nodes == 1]
    assert [c.host for c in one] == ["a", "b", "c", "d", "e"]
    assert {c.case_key for c in one} == {"cnn.resnet50.bs64.g1.parameter_server"}
    multi = [(c.host, c.case_key, c.host_set) for c in cases if c.nodes > 1]
    assert multi == [
        ("a", "cnn.resnet50.bs64.g1.parameter_server.n2.a+b", ["a", "b"]),
        ("c", "cnn.resnet50.bs64.g1.parameter_server.n2.c+d", ["c", "d"]),
        ("a", "cnn.resnet50.bs64.g1.parameter_server.n4.a+b+c+d", ["a", "b", "c", "d"])]
    case = next(c for c in cases if c.nodes == 2)
    assert case.container["network_mode"] == "host" and case.axes["nodes"] == 2
    assert case.cluster == {"base_port": 23456, "rendezvous_timeout_s": 300, "mixed_gpu_models": False,
                            "layout": "ps_worker"}
    # the same config plans the same keys; a hosts filter keeps only whole sets
    assert [c.to_dict() for c in cases] == [c.to_dict() for c in expand_cases(parse_config(config(nodes=[1, 2, 4])))]
    kept = expand_cases(parse_config(config(nodes=[2])), hosts=["a", "b", "c"])
    assert [c.host_set for c in kept] == [["a", "b"]]


def test_a_set_too_long_to_spell_in_the_case_key_is_named_by_a_digest():
    """benchmark_results.case_key holds 250 characters (PostgreSQL refuses more, and the night's store with it):
    32 hosts of 11 characters would be 414."""
    point = "cnn.resnet50.bs64.g8.distributed_replicated"
    hosts = [f"gpu-a100-{i:02d}" for i in range(32)]
    key = multinode.set_case_key(point, hosts)
    assert len(key) <= multinode.MAX_CASE_KEY
    assert key.startswith(f"{point}.n32.gpu-a100-00+31more.") and len(key.rsplit(".", 1)[1]) == 12
    assert key == multinode.set_case_key(point, hosts)  # the same set, the same key, night after night
    assert key != multinode.set_case_key(point, hosts[:31] + ["gpu-a100-99"])
    assert multinode.set_case_key(point, hosts[:2]) == f"{point}.n2.gpu-a100-00+gpu-a100-01"  # short: spelled out
    long_names = ["h" + "x" * 62 + str(i) for i in range(4)]
    key = multinode.set_case_key("b" * 63 + "." + "m" * 63 + ".bs64.g8.distributed_replicated", long_names)
    assert len(key) <= multinode.MAX_CASE_KEY


def test_nodes_without_1_plans_no_single_host_case_and_build_plan_keeps_every_spanned_host():
    cfg = parse_config(config(hosts=("a", "b", "c"), nodes=[3]))
    plan = build_plan(cfg, {"dag_id": "d", "run_id": "r"})
    assert [(c.host, c.hosts) for c in plan.cases] == [("a", ["a", "b", "c"])]
    assert [h.name for h in plan.hosts] == ["a", "b", "c"]
    assert all(h.needs.gpus == 1 for h in plan.hosts)


def test_role_layouts():
    assert multinode.layout(["a", "b"], 1, 1) == [
        {"host": "a", "job": "worker", "task_index": 0}, {"host": "b", "job": "worker", "task_index": 1},
        {"host": "a", "job": "ps", "task_index": 0}, {"host": "b", "job": "ps", "task_index": 1}]
    assert multinode.layout(["a", "b"], 1, 2, ps_nodes="first") == [
        {"host": "a", "job": "worker", "task_index": 0}, {"host": "a", "job": "worker", "task_index": 1},
        {"host": "b", "job": "worker", "task_index": 2}, {"host": "b", "job": "worker", "task_index": 3},
        {"host": "a", "job": "ps", "task_index": 0}]
    roles = multinode.layout(["a", "b"], 0, 1)
    assert [multinode.role_name(r) for r in roles] == ["worker0", "worker1"]
    assert [multinode.is_chief(r) for r in roles] == [True, False]


def test_cluster_spec_of_each_role():
    roles = multinode.layout(["a", "b"], 1, 1, ps_nodes="first")
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2"}
    ports = [23456, 23457, 23458]
    assert [multinode.role_command(["python", "x.py"], roles, ports, addresses, r) for r in roles] == [
        ["python", "x.py", "--job_name=worker", "--ps_hosts=10.0.0.1:23458",
         "--worker_hosts=10.0.0.1:23456,10.0.0.2:23457", "--task_index=0"],
        ["python", "x.py", "--job_name=worker", "--ps_hosts=10.0.0.1:23458",
         "--worker_hosts=10.0.0.1:23456,10.0.0.2:23457", "--task_index=1"],
        ["python", "x.py", "--job_name=ps", "--ps_hosts=10.0.0.1:23458",
         "--worker_hosts=10.0.0.1:23456,10.0.0.2:23457", "--task_index=0"]]


# -- ports ----------------------------------------------------------------------------------------
def test_a_taken_port_is_skipped_and_none_left_is_port_unavailable():
    roles = multinode.layout(["a", "b"], 1, 1, ps_nodes="first")
    addresses, local = {"a": "127.0.0.1", "b": "127.0.0.2"}, {"a": True, "b": True}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        base = taken.getsockname()[1]
        assert not multinode.port_free("127.0.0.1", base, local=True)
        assert not multinode.port_free("127.0.0.1", base, local=False)  # something answers there
        ports = multinode.allocate_ports(roles, addresses, local, base)
        assert base not in ports and len(set(ports)) == 3
        with pytest.raises(multinode.PortUnavailable, match=r"no free port for worker0 on a \(127.0.0.1\) in "):
            multinode.allocate_ports(roles, addresses, local, base, is_free=lambda a, p, loc: p != p)
    # ports are distinct across the case even when its hosts are one machine
    assert multinode.allocate_ports(roles, addresses, local, 40000, is_free=lambda a, p, loc: True) == [
        40000, 40001, 40002]


def test_a_port_taken_on_another_address_of_this_machine_is_taken():
    """The roles' servers bind every address (TF's gRPC server 0.0.0.0:<port>): a listener on 127.0.0.1 takes the port
    for a role on 127.0.0.2 too (it was judged free; the role then failed to bind it)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not multinode.port_free("127.0.0.2", port, local=True)
        roles = [r for r in multinode.layout(["a", "b"], 1, 1, ps_nodes="first") if r["host"] == "b"]
        assert port not in multinode.allocate_ports(roles, {"a": "127.0.0.1", "b": "127.0.0.2"},
                                                    {"a": True, "b": True}, port)


# -- roles' ends, from real logs ------------------------------------------------------------------
def test_each_role_of_a_real_ps_worker_run_ends_ok_and_the_chief_gives_the_result():
    from fleetbench.measure import measure

    roles = multinode.layout(["a", "b"], 1, 1, ps_nodes="first")
    logs = {"worker0": "dist-w0.log", "worker1": "dist-w1.log", "ps0": "dist-ps.log"}
    ends = {multinode.role_name(r): multinode.classify_role(r, {
        "exit_code": 137 if r["job"] == "ps" else 0, "stopped": r["job"] == "ps",
        "log_path": str(DIST / logs[multinode.role_name(r)])}) for r in roles}
    assert {n: (e.status, e.failure_class, e.stopped) for n, e in ends.items()} == {
        "worker0": ("ok", None, False), "worker1": ("ok", None, False), "ps0": ("ok", None, True)}
    fields, steps = measure({"command": ["x"]}, {"exit_code": 0, "log_path": str(DIST / "dist-w0.log")})
    assert (fields["status"], fields["images_per_sec"], len(steps)) == ("ok", 139.24, 3)



def test_the_global_batch_of_a_multi_node_case_counts_every_workers_batch_as_the_real_log_does():
    from fleetbench.metrics import time_for_batches_s
    from fleetbench.parsing import parse_log_file

    data = config(hosts=("a", "b"), device="cpu", models=["trivial"], batch_sizes=[8], num_gpus=[0], nodes=[2],
                  num_batches=20, ps_nodes="first")
    [case] = expand_cases(parse_config(data))  # the fixture's run: 2 workers and a ps, batch 8 on one CPU each
    log = parse_log_file(str(DIST / "dist-w0.log"), "tf_cnn_benchmarks")  # "Batch size:  16 global"
    assert case.batch_size_global == log.batch_size_global == 16
    assert time_for_batches_s(case.num_batches, case.batch_size_global, log.total_images_per_sec) == (
        pytest.approx(20 * 16 / 139.24, rel=1e-3))
    data["benchmarks"][0]["workers_per_node"] = 2
    assert expand_cases(parse_config(data))[0].batch_size_global == 8 * 2 * 2
    gpu = [c for c in expand_cases(parse_config(config(hosts=("a", "b"), num_gpus=[8]))) if c.nodes == 2]
    assert [c.batch_size_global for c in gpu] == [64 * 8 * 2]  # a worker per host on 8 GPUs each

def test_a_killed_worker_is_a_peer_failure_naming_it_and_its_own_class(tmp_path):
    log = tmp_path / "w1.log"
    log.write_text("".join((DIST / "dist-w1.log").read_text().splitlines(keepends=True)[:30]))  # cut mid-run
    worker1 = {"host": "b", "job": "worker", "task_index": 1}
    end = multinode.classify_role(worker1, {"exit_code": 137, "log_path": str(log)})
    assert (end.status, end.failure_class) == ("failed", "killed")
    assert multinode.peer_failure(end) == (
        "peer_failed", "worker1 on b failed (killed: killed by SIGKILL (exit 137) without an OOM kill); every other "
                       "container of the case was stopped")
    chief = {"host": "a", "job": "worker", "task_index": 0}
    end = multinode.classify_role(chief, {"exit_code": 0, "log_path": str(log)})  # the chief must print a result
    assert (end.status, end.failure_class) == ("failed", "no_result")
    ps = {"host": "a", "job": "ps", "task_index": 0}
    assert multinode.classify_role(ps, {"exit_code": 1, "log_path": str(DIST / "dist-ps.log")}).failure_class == (
        "nonzero_exit")


# -- rows and efficiency --------------------------------------------------------------------------
def test_rows_record_hosts_and_roles_and_the_efficiency_across_nodes():
    from fleetbench.measure import multinode_fields
    from fleetbench.metrics import derive

    cases = expand_cases(parse_config(config(hosts=("a", "b"))))
    single, multi = cases[0], cases[-1]
    assert multinode_fields(single) == {"nodes": 1, "host_set": None, "roles_json": None}
    fields = multinode_fields(multi)
    assert (fields["nodes"], fields["host_set"]) == (2, "a,b")
    assert [(r["host"], r["job"]) for r in json.loads(fields["roles_json"])] == [
        ("a", "worker"), ("b", "worker"), ("a", "ps"), ("b", "ps")]

    def row(host, case_key, ips, nodes=1, host_set=None, **extra):
        return {"dag_id": "d", "run_id": "r", "host": host, "case_key": case_key, "status": "ok", "harness":
                "tf_cnn_benchmarks", "model": "resnet50", "batch_size_per_device": 64, "num_gpus": 1, "device": "gpu",
                "images_per_sec": ips, "nodes": nodes, "host_set": host_set, "command": ["x"], **extra}

    rows = derive([row("a", "k", 100.0), row("b", "k", 120.0), row("c", "k", 999.0),
                   row("a", "k.n2.a+b", 165.0, 2, "a,b"),
                   row("a", "k.bs32", 50.0, batch_size_per_device=32),  # another batch: no baseline
                   row("c", "k.n2.c+d", 10.0, 2, "c,d", model="vgg16")], [], None, None)
    got = {(r["host"], r["case_key"]): (r["node_efficiency"], r["node_baseline_images_per_sec"]) for r in rows}
    assert got[("a", "k.n2.a+b")] == pytest.approx((165.0 / (2 * 110.0), 110.0))
    assert got[("a", "k")] == (None, None) and got[("c", "k.n2.c+d")] == (None, None)
    # b's 1-node case failed: a's figure alone is not the set's baseline (as a failed 1-GPU case gives no speedup)
    rows = derive([row("a", "k", 100.0), row("b", "k", None, status="failed"),
                   row("a", "k.n2.a+b", 165.0, 2, "a,b")], [], None, None)
    assert {(r["node_efficiency"], r["node_baseline_images_per_sec"]) for r in rows} == {(None, None)}


def test_a_ps_worker_rows_step_figures_are_the_clusters_as_its_total_is():
    """The chief of a ps_worker case prints its own images/sec at each step and the cluster's as its total (the real
    TF 2.15 run: steps ~69, total 139.24 with two workers): the step median and spread are scaled to the cluster,
    the unit of images_per_sec; the CV is the same either way."""
    from fleetbench.harnesses import get
    from fleetbench.metrics import derive, step_stats

    measured = get("tf_cnn_benchmarks").measure(str(DIST / "dist-w0.log"), {})
    per_worker = [s["images_per_sec"] for s in measured.steps]
    roles = [{"host": "a", "job": "worker", "task_index": 0}, {"host": "b", "job": "worker", "task_index": 1},
             {"host": "a", "job": "ps", "task_index": 0}]
    row = {"dag_id": "d", "run_id": "r", "host": "a", "case_key": "k.n2.a+b", "status": "ok", "model": "trivial",
           "harness": "tf_cnn_benchmarks", "batch_size_per_device": 8, "num_gpus": 1, "device": "cpu", "nodes": 2,
           "host_set": "a,b", "roles_json": json.dumps(roles), "images_per_sec": measured.images_per_sec,
           "command": ["x"]}
    steps = [{"host": "a", "case_key": "k.n2.a+b", "step": s["step"], "images_per_sec": s["images_per_sec"]}
             for s in measured.steps]
    [got] = derive([row], steps, None, None)
    alone = step_stats(per_worker)
    assert measured.images_per_sec == 139.24 and alone.median == 69.0
    assert got["step_median_images_per_sec"] == pytest.approx(2 * alone.median)
    assert got["step_spread_images_per_sec"] == pytest.approx(2 * alone.spread)
    assert got["step_cv"] == pytest.approx(alone.cv)
    [single] = derive([{**row, "nodes": 1, "host_set": None, "roles_json": None}], steps, None, None)
    assert single["step_median_images_per_sec"] == alone.median  # one process: as printed



def node_rows(data: dict, one_node: dict[str, float]) -> list[dict]:
    """Result rows of every case of the config as plan and collect build them: a 1-node case does one_node[its
    benchmark] images/sec, a multi-node case 95 % of nodes x that."""
    from fleetbench.measure import result_row
    from fleetbench.run_model import RunInfo

    rows = []
    for c in expand_cases(parse_config(data)):
        one = one_node[c.benchmark]
        rows.append(result_row(RunInfo(dag_id="d", run_id="r"), c, None, None, {
            "status": "ok", "images_per_sec": one if c.nodes == 1 else 0.95 * c.nodes * one, "duration_s": 60.0,
            "command": c.command}))
    return rows


@pytest.mark.parametrize("reverse", [False, True])
def test_the_1_node_baseline_is_of_the_same_image_and_benchmark(reverse):
    from fleetbench.metrics import derive

    data = config(hosts=("a", "b"))
    data["images"].append({**data["images"][0], "name": "tf2", "ref": "127.0.0.1:5000/tf:2"})
    base = data["benchmarks"][0]
    data["benchmarks"] += [{**base, "name": "cnn-new", "image": "tf2"},  # another image
                           {**base, "name": "cnn-env", "container": {"environment": {"X": "1"}}}]  # the same image
    if reverse:  # the config's order decided which 1-node row was every multi-node row's baseline
        data["benchmarks"].reverse()
    rows = derive(node_rows(data, {"cnn": 150.0, "cnn-new": 300.0, "cnn-env": 200.0}), [], None, None)
    got = {r["benchmark"]: (r["node_efficiency"], r["node_baseline_images_per_sec"]) for r in rows if r["nodes"] > 1}
    assert got == {"cnn": (pytest.approx(0.95), 150.0), "cnn-new": (pytest.approx(0.95), 300.0),
                   "cnn-env": (pytest.approx(0.95), 200.0)}


def test_a_cluster_mode_takes_the_1_node_baseline_of_another_benchmark_of_its_image():
    from fleetbench.metrics import derive

    data = config(hosts=("a", "b"), variable_update=["replicated"], nodes=[1])
    data["benchmarks"].append({**data["benchmarks"][0], "name": "dist", "variable_update": ["distributed_replicated"],
                               "nodes": [2]})
    rows = derive(node_rows(data, {"cnn": 150.0, "dist": 150.0}), [], None, None)
    (multi,) = [r for r in rows if r["nodes"] > 1]
    assert (multi["benchmark"], multi["node_efficiency"], multi["node_baseline_images_per_sec"]) == (
        "dist", pytest.approx(0.95), 150.0)
    # two other benchmarks of its image with a 1-node case: which is its baseline is not known, so none
    data["benchmarks"].append({**data["benchmarks"][0], "name": "cnn2", "container": {"environment": {"X": "1"}}})
    rows = derive(node_rows(data, {"cnn": 150.0, "cnn2": 100.0, "dist": 150.0}), [], None, None)
    (multi,) = [r for r in rows if r["nodes"] > 1]
    assert (multi["node_efficiency"], multi["node_baseline_images_per_sec"]) == (None, None)


def test_a_baseline_benchmark_with_several_variable_updates_gives_the_matching_one_or_none():
    """The 1-node rows of one benchmark with two variable updates both matched, and the one the config listed last was
    the baseline (efficiency 1.5 or 0.75 by the list's order). Now the row's own variable update, else none."""
    from fleetbench.metrics import derive

    for updates in (["replicated", "parameter_server"], ["parameter_server", "replicated"]):
        data = config(hosts=("a", "b"), variable_update=updates, nodes=[1])
        data["benchmarks"].append({**data["benchmarks"][0], "name": "dist", "nodes": [2],
                                   "variable_update": ["distributed_replicated"]})
        rows = node_rows(data, {"cnn": 0.0, "dist": 1000.0 / 0.95})
        for r in rows:
            if r["benchmark"] == "cnn":
                r["images_per_sec"] = {"replicated": 2000.0, "parameter_server": 1000.0}[r["variable_update"]]
        (multi,) = [r for r in derive(rows, [], None, None) if r["nodes"] > 1]
        assert (multi["node_efficiency"], multi["node_baseline_images_per_sec"]) == (None, None), updates
    # a multi-node case of the same variable update as one of them takes that one
    data = config(hosts=("a", "b"), variable_update=["replicated", "parameter_server"], nodes=[1])
    data["benchmarks"].append({**data["benchmarks"][0], "name": "multi", "nodes": [2],
                               "variable_update": ["parameter_server"]})
    rows = node_rows(data, {"cnn": 0.0, "multi": 1000.0})
    for r in rows:
        if r["benchmark"] == "cnn":
            r["images_per_sec"] = {"replicated": 2000.0, "parameter_server": 1000.0}[r["variable_update"]]
    (multi,) = [r for r in derive(rows, [], None, None) if r["nodes"] > 1]
    assert (multi["node_efficiency"], multi["node_baseline_images_per_sec"]) == (pytest.approx(0.95), 1000.0)


# -- what keeps a set from running ----------------------------------------------------------------
def test_a_set_with_an_unfit_host_or_two_gpu_models_is_a_row_that_says_why_and_runs_nothing():
    from fleetbench.airflow.multinode import multinode_kwargs
    from fleetbench.airflow.pipeline import collect
    from fleetbench.run_model import HostImages, HostVerdict

    cfg = parse_config(config(hosts=("a", "b", "c", "d"), nodes=[2]))
    plan = build_plan(cfg, {"dag_id": "d", "run_id": "r"}).to_xcom()

    def verdict(host, gpu="NVIDIA A100-SXM4-40GB", state="ready", reasons=""):
        return HostVerdict(host=host, verdict=state, reasons=reasons, facts={
            "gpus": [{"index": 0, "name": gpu, "uuid": None, "memory_total_mib": 40960}]}).to_xcom()

    image = {"tf1": {"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "pinned_ref": "127.0.0.1:5000/tf@sha256:" + "a" * 64,
                     "digest": "sha256:" + "a" * 64}}
    validations = [verdict("a"), verdict("b", state="unfit", reasons="gpu_count: 0 GPU(s)"), verdict("c"),
                   verdict("d", gpu="NVIDIA GeForce RTX 3070")]
    prepared = [HostImages(host=h, images=image).to_xcom() for h in "abcd"]
    assert multinode_kwargs(plan, validations, prepared) == []  # neither set can run
    rows = {r["case_key"].rsplit(".", 1)[1]: r for r in collect(plan, validations, prepared, [])["rows"]}
    assert (rows["a+b"]["status"], rows["a+b"]["failure_class"], rows["a+b"]["failure_detail"]) == (
        "skipped", "host_unfit", "host b of the set is unfit: gpu_count: 0 GPU(s)")
    assert (rows["c+d"]["status"], rows["c+d"]["failure_class"]) == ("skipped", "mixed_gpu_models")
    assert rows["c+d"]["failure_detail"] == ("the hosts of the set have different GPU models (c: NVIDIA "
                                             "A100-SXM4-40GB, d: NVIDIA GeForce RTX 3070)")
    assert (rows["c+d"]["nodes"], rows["c+d"]["host_set"]) == (2, "c,d")

    validations[1] = verdict("b")
    from fleetbench.airflow.operators import case_kwargs

    # the host lanes never run a case that spans hosts: it is the multinode group's
    assert case_kwargs(plan, validations, prepared, host="a") == []
    [kwargs] = multinode_kwargs(plan, validations, prepared)
    assert kwargs["case"]["hosts"] == ["a", "b"] and kwargs["num_gpus"] == 1
    assert [(r["host"], r["job"], r["address"], r["local"], r["labels"]["org.fleetbench.role"])
            for r in kwargs["roles"]] == [("a", "worker", "10.0.0.1", False, "worker0"),
                                          ("b", "worker", "10.0.0.2", False, "worker1"),
                                          ("a", "ps", "10.0.0.1", False, "ps0"), ("b", "ps", "10.0.0.2", False, "ps1")]
    assert len({r["container_name"] for r in kwargs["roles"]}) == 4


def test_gpus_go_to_the_workers_not_the_parameter_servers():
    """TensorFlow takes every visible GPU's memory: a ps container beside a worker must see none."""
    from fleetbench.airflow.multinode import MultiNodeCaseOperator

    roles = multinode.layout(["a", "b"], 1, 1, ps_nodes="all")
    op = MultiNodeCaseOperator(task_id="mn", case={"host": "a", "case_key": "k"}, command=["python"], roles=roles,
                               cluster={}, timeout_s=60, log_dir="/tmp", num_gpus=4)
    requests = {multinode.role_name(r): op._device_requests(r) for r in roles}
    assert sorted(r["job"] for r in roles) == ["ps", "ps", "worker", "worker"]
    assert {name for name, req in requests.items() if req is None} == {
        multinode.role_name(r) for r in roles if r["job"] == "ps"}
    assert all(req[0]["Count"] == 4 for name, req in requests.items() if req is not None)


def test_the_role_that_failed_first_is_the_cause_by_time_not_by_text():
    """Docker drops a timestamp's trailing zeros: `...01:00:00Z` (a whole second) sorted after `...01:00:00.3Z` as
    text, so a parameter server that died after worker1 was named the cause."""
    from datetime import datetime, timezone

    from fleetbench.airflow.multinode import MultiNodeCaseOperator

    roles = multinode.layout(["a", "b"], 1, 1, ps_nodes="first")
    op = MultiNodeCaseOperator(task_id="mn", case={"host": "a", "case_key": "k"}, command=["python"], roles=roles,
                               cluster={}, timeout_s=60, log_dir="/tmp", num_gpus=0)
    ended = {"worker1": "2026-12-08T01:00:00Z", "ps0": "2026-12-08T01:00:00.3Z"}
    states = {multinode.role_name(r): {"Status": "exited" if multinode.role_name(r) in ended else "running",
                                       "ExitCode": 1 if multinode.role_name(r) in ended else 0,
                                       "FinishedAt": ended.get(multinode.role_name(r), "0001-01-01T00:00:00Z")}
              for r in roles}

    class Engine:
        def inspect_container(self, cid):
            return {"State": states[cid]}

    op._cids = {multinode.role_name(r): multinode.role_name(r) for r in roles}
    op._cli = lambda role: Engine()
    reason, role = op._watch(datetime.now(timezone.utc))
    assert (reason, multinode.role_name(role)) == ("failed", "worker1")


def test_host_pools_with_multi_node_cases_is_a_warning_that_says_what_is_not_covered():
    data = config(hosts=("a", "b"))
    assert not [w for w in config_warnings(parse_config(data)) if "host_pools" in w]
    data["fleet"] = {"host_pools": True}
    assert [w for w in config_warnings(parse_config(data)) if "host_pools" in w] == [
        "benchmarks[0].nodes: multi-node cases do not take the per-host pools (fleet.host_pools); within "
        "fleet_benchmark they never overlap a host's other cases, but another DAG's task in a spanned host's pool "
        "can"]


def test_each_node_gets_its_hosts_gpus_as_a_single_node_case_would():
    """A worker's GPUs come from its own host's facts (`devices.assign`, then gpu_selection): on a host with MIG on
    GPU 0 (the published 4x A100 listing, tests/fixtures/gpu-tools) it is named by the UUID of a GPU without MIG;
    with gpu_selection device_ids every worker names its host's first GPUs; a set where one host has too few
    whole GPUs is skipped as mig_enabled, naming that host. Parameter servers get none."""
    from fleetbench.airflow.multinode import MultiNodeCaseOperator, multinode_kwargs
    from fleetbench.airflow.pipeline import collect
    from fleetbench.hosts import gpu_health as G
    from fleetbench.run_model import HostImages, HostVerdict

    listing = G.parse_gpu_list((Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools" /
                                "nvidia-smi-L_4xa100-80gb_gpu0-mig-4x1g.20gb.txt").read_text())
    whole = [{"index": g["index"], "name": g["name"], "uuid": g["uuid"], "memory_total_mib": 81920} for g in listing]
    facts = {"a": {"gpus": [{**g, "uuid": f"GPU-a{g['index']}"} for g in whole]},
             "b": {"gpus": whole, "gpu_list": listing}}
    image = {"tf1": {"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "pinned_ref": "127.0.0.1:5000/tf@sha256:" + "a" * 64,
                     "digest": "sha256:" + "a" * 64}}
    validations = [HostVerdict(host=h, verdict="ready", reasons="", facts=facts[h]).to_xcom() for h in "ab"]
    prepared = [HostImages(host=h, images=image).to_xcom() for h in "ab"]

    def devices(**bench):
        plan = build_plan(parse_config(config(hosts=("a", "b"), nodes=[2], **bench)),
                          {"dag_id": "d", "run_id": "r"}).to_xcom()
        return plan, multinode_kwargs(plan, validations, prepared)

    _, [kwargs] = devices()
    got = {(r["host"], r["job"]): r["gpu_device_ids"] for r in kwargs["roles"]}
    assert got == {("a", "worker"): None, ("b", "worker"): ["GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95"],
                   ("a", "ps"): None, ("b", "ps"): None}
    op = MultiNodeCaseOperator(task_id="mn", **{k: v for k, v in kwargs.items() if k != "container"})
    by_host = {(r["host"], r["job"]): op._device_requests(r) for r in kwargs["roles"]}
    assert by_host[("b", "worker")][0]["DeviceIDs"] == ["GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95"]
    assert by_host[("a", "worker")][0]["Count"] == 1 and by_host[("a", "ps")] is None

    _, [kwargs] = devices(num_gpus=[2], container={"gpu_selection": "device_ids"})
    got = {r["host"]: r["gpu_device_ids"] for r in kwargs["roles"] if r["job"] == "worker"}
    assert got == {"a": ["GPU-a0", "GPU-a1"], "b": ["GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95",
                                                    "GPU-5e375e7e-b41f-155b-dcdc-534524c356fc"]}

    plan, kwargs = devices(num_gpus=[4])
    assert kwargs == []
    [row] = [r for r in collect(plan, validations, prepared, [])["rows"] if r["nodes"] == 2]
    assert (row["status"], row["failure_class"]) == ("skipped", "mig_enabled")
    assert row["failure_detail"].startswith("host b of the set: the case needs 4 whole GPU(s), and MIG is enabled")


def test_a_set_whose_hosts_pinned_different_images_runs_nothing_and_lists_the_digests():
    """The tag moved between two lanes' pulls (or a host kept last month's copy under if-missing): the case would mix
    images across its nodes, and its row could name only one digest."""
    from fleetbench.airflow.multinode import multinode_kwargs
    from fleetbench.airflow.pipeline import collect
    from fleetbench.run_model import HostImages, HostVerdict

    plan = build_plan(parse_config(config(hosts=("a", "b"), nodes=[2])), {"dag_id": "d", "run_id": "r"}).to_xcom()
    validations = [HostVerdict(host=h, verdict="ready", reasons="", facts={
        "gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "uuid": None, "memory_total_mib": 40960}]}).to_xcom()
        for h in "ab"]

    def pinned(digit: str) -> dict:
        return {"tf1": {"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "digest": "sha256:" + digit * 64,
                        "pinned_ref": "127.0.0.1:5000/tf@sha256:" + digit * 64}}

    prepared = [HostImages(host="a", images=pinned("a")).to_xcom(), HostImages(host="b", images=pinned("b")).to_xcom()]
    assert multinode_kwargs(plan, validations, prepared) == []
    [row] = [r for r in collect(plan, validations, prepared, [])["rows"] if r["nodes"] == 2]
    assert (row["status"], row["failure_class"], row["failure_detail"]) == (
        "failed", "image_mismatch",
        "the hosts of the set pinned different images of tf1: a: aaaaaaaaaaaa, b: bbbbbbbbbbbb")
    same = [HostImages(host=h, images=pinned("a")).to_xcom() for h in "ab"]
    assert len(multinode_kwargs(plan, validations, same)) == 1


def test_a_sets_row_records_the_drivers_and_the_worst_gpu_health_of_every_host():
    """A driver upgraded on the second host of a set changes the row's driver (a new regression segment, and
    `compare --driver` matches neither side while the set is mixed); a degraded GPU on any host of the set is the
    row's health. A set of one driver keeps it as one value."""
    from fleetbench.airflow.pipeline import collect
    from fleetbench.run_model import HostImages, HostVerdict

    plan = build_plan(parse_config(config(hosts=("a", "b"), nodes=[2])), {"dag_id": "d", "run_id": "r"}).to_xcom()
    gpus = [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "uuid": None, "memory_total_mib": 40960}]
    image = {"tf1": {"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "pinned_ref": "127.0.0.1:5000/tf@sha256:" + "a" * 64,
                     "digest": "sha256:" + "a" * 64}}
    prepared = [HostImages(host=h, images=image).to_xcom() for h in "ab"]

    def row(drivers: dict, health: dict):
        validations = [HostVerdict(host=h, verdict="ready", reasons="", facts={
            "gpus": gpus, "driver_version": drivers[h][0], "cuda_driver_version": drivers[h][1]},
            checks=[{"name": "gpu_persistence", "status": health[h], "detail": ""}]).to_xcom() for h in "ab"]
        [r] = [r for r in collect(plan, validations, prepared, [])["rows"] if r["nodes"] == 2]
        return r["host"], r["driver_version"], r["cuda_driver_version"], r["gpu_model"], r["host_gpu_health"]

    assert row({"a": ("550.54.15", "12.4"), "b": ("570.86.10", "12.8")}, {"a": "pass", "b": "warn"}) == (
        "a", "550.54.15+570.86.10", "12.4+12.8", "NVIDIA A100-SXM4-40GB", "degraded")
    assert row({"a": ("550.54.15", "12.4"), "b": ("550.54.15", "12.4")}, {"a": "pass", "b": "pass"}) == (
        "a", "550.54.15", "12.4", "NVIDIA A100-SXM4-40GB", "healthy")
    # one host's driver unknown: the set's value says so rather than taking the other host's
    assert row({"a": ("550.54.15", "12.4"), "b": (None, None)}, {"a": "pass", "b": "pass"})[1:3] == (
        "550.54.15+?", "12.4+?")


def test_a_long_mixed_provenance_fits_its_column_and_stays_distinct():
    from fleetbench.measure import _set_value

    many = [f"{535 + i}.{i:02d}.{i:02d}" for i in range(8)]
    a, b = _set_value(many, 50), _set_value(many[:-1] + ["999.99.99"], 50)
    assert len(a) == len(b) == 50 and a != b and a.startswith("535.00.00+536.01.01")


def test_a_ps_worker_cluster_without_a_parameter_server_is_refused():
    """parameter_server and distributed_replicated put the variables on /job:ps: with ps_per_node 0 every case got
    `--ps_hosts=` and failed every night, and nothing said the config was why."""
    assert errors_of(config(hosts=("a", "b"), nodes=[2], ps_per_node=0)) == [
        "benchmarks[0].ps_per_node: 0 leaves the cluster without a parameter server, which variable_update "
        "parameter_server and distributed_replicated need (tf_cnn_benchmarks puts the variables on /job:ps): give at "
        "least 1"]
    parse_config(config(hosts=("a", "b"), nodes=[1], ps_per_node=0))  # no cluster: the field does not apply


def test_a_cpu_ps_worker_case_with_several_workers_per_host_has_no_1_node_efficiency():
    """A CPU 1-node case is one process: two workers per host against it read as super-linear scaling (1.5 from
    300 vs 2 x 100). Like a launcher case with several ranks per host, it gets no efficiency; one worker per host
    keeps it."""
    from fleetbench.metrics import match_nodes

    def row(host, case_key, ips, nodes=1, roles=None):
        return {"dag_id": "d", "run_id": "r", "host": host, "case_key": case_key, "status": "ok", "benchmark": "cnn",
                "harness": "tf_cnn_benchmarks", "model": "trivial", "batch_size_per_device": 8, "num_gpus": 0,
                "device": "cpu", "images_per_sec": ips, "nodes": nodes, "host_set": "a,b" if nodes > 1 else None,
                "roles_json": json.dumps(roles) if roles else None, "command": ["x"]}

    singles = [row("a", "k", 100.0), row("b", "k", 100.0)]
    two = multinode.layout(["a", "b"], 1, 2)
    one = multinode.layout(["a", "b"], 1, 1)
    assert match_nodes([*singles, row("a", "k.n2.a+b", 300.0, 2, two)]) == {}
    assert match_nodes([*singles, row("a", "k.n2.a+b", 180.0, 2, one)]) == {("a", "k.n2.a+b"): (0.9, 100.0)}


def test_a_mixed_sets_row_is_priced_at_its_first_hosts_gpu():
    """A set of two GPU models (mixed_gpu_models) names both on its row; its cost and estimated energy still come
    from the first host's GPU, as README says (the joined name matched no catalog entry: no cost, no energy)."""
    from fleetbench.metrics import MetricSettings, derive, load_catalog

    row = {"dag_id": "d", "run_id": "r", "status": "ok", "duration_s": 3600.0, "benchmark": "b", "model": "resnet50",
           "batch_size_per_device": 64, "device": "gpu", "host": "a", "case_key": "cnn.n2.a+b", "num_gpus": 1,
           "nodes": 2, "host_set": "a,b", "images_per_sec": 1000.0, "energy_source": "none",
           "gpu_model": "NVIDIA A100-SXM4-80GB+NVIDIA GeForce RTX 3070"}
    [got] = derive([row], [], load_catalog(), MetricSettings())
    assert (got["gpu_catalog_name"], got["price_source"], got["energy_source"]) == (
        "A100 SXM4 80GB", "catalog", "estimated")
    assert got["cost_usd"] == pytest.approx(2 * got["price_per_gpu_hour"])  # 2 nodes x 1 GPU x 1 hour


def test_a_plan_travels_as_slices_each_task_reading_what_it_needs():
    """The plan task pushes the plan without its cases and one XCom per host: its single-node cases and the
    multi-node cases it is in (a set's case in each of its hosts' slices). A lane reads its host's slice (its images
    serve both), the multi-node step the slices of the hosts in sets, store every slice, in the plan's order of
    the cases, each case once; a host in no set reads no multi-node case."""
    from fleetbench.run_model import MissingPlan, RunPlan, slice_key

    plan = build_plan(parse_config(config()), {"dag_id": "d", "run_id": "r"})
    sets = [c for c in plan.cases if c.nodes > 1]
    assert [c.hosts for c in sets] == [["a", "b"], ["c", "d"]]  # e is in no set
    head, slices = plan.split()
    assert head["cases"] == [] and head["case_total"] == len(plan.cases) and head["multinode_hosts"] == list("abcd")
    assert set(slices) == {slice_key(h) for h in "abcde"}
    assert [(c["host"], c["nodes"]) for _, c in slices[slice_key("b")]] == [("b", 1), ("a", 2)]
    assert [(c["host"], c["nodes"]) for _, c in slices[slice_key("e")]] == [("e", 1)]
    pulled = []

    def pull(key):
        pulled.append(key)
        return json.loads(json.dumps(slices[key]))  # through JSON, as XCom keeps it

    loaded = RunPlan.load(json.loads(json.dumps(head)))
    assert loaded.case_count == len(plan.cases) and loaded.cases == []
    lane = loaded.with_cases(pull, ["b"])
    assert pulled == [slice_key("b")]
    assert [c.case_key for c in lane.cases] == [c.case_key for c in plan.cases if "b" in c.hosts]
    assert lane.case_count == len(plan.cases)  # a dry run's log still counts the night's cases
    pulled.clear()
    multi = loaded.with_cases(pull, loaded.multinode_hosts)
    assert pulled == [slice_key(h) for h in "abcd"]
    assert [c.case_key for c in multi.cases if c.nodes > 1] == [c.case_key for c in sets]  # each set's case once
    pulled.clear()
    whole = loaded.with_cases(pull)
    assert sorted(pulled) == sorted(slices) and whole.slices is None
    assert [c.case_key for c in whole.cases] == [c.case_key for c in plan.cases]  # each once, in the plan's order
    assert whole.cases == plan.cases
    assert RunPlan.load(plan.to_xcom()).with_cases(pull).cases == plan.cases  # an unsplit plan reads nothing more
    with pytest.raises(MissingPlan, match=r"2 case\(s\) under XCom 'plan.cases.host.c'.*none could be read"):
        loaded.with_cases(lambda key: None if key == slice_key("c") else slices[key])
