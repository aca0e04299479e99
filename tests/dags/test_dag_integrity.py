"""Every DAG in dags/ imports cleanly, is wired as documented, and parsing touches no service."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleet_configs import write_config

DAGS = Path(__file__).resolve().parents[2] / "dags"


def load_bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@pytest.fixture()
def no_services(monkeypatch):
    """Point every service at nowhere and forbid network connections: parsing must not need them. Each attempt is
    noted and the test fails after it, so a DAG file that catches the refusal (`except Exception`) is caught too;
    libpq (psycopg2), which opens its sockets in C, is refused at `psycopg2.connect`."""
    import psycopg2

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", "postgresql://nobody:nothing@127.0.0.1:1/none")
    attempts: list[str] = []

    def refusing(what: str):
        def refuse(*args, **kwargs):
            attempts.append(f"{what}{args[1:] if what.startswith('socket') else ''}")
            raise AssertionError(f"a DAG file opened a connection at parse time ({what})")
        return refuse

    monkeypatch.setattr(socket.socket, "connect", refusing("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", refusing("socket.connect_ex"))
    monkeypatch.setattr(psycopg2, "connect", refusing("psycopg2.connect"))
    yield attempts
    assert attempts == [], f"parsing the DAG files opened connections: {attempts}"


def test_dags_import_without_errors_or_io(no_services):
    bag = load_bag()
    assert bag.import_errors == {}
    assert "fleet_benchmark" in bag.dag_ids


def test_fleet_benchmark_shape(no_services):
    dag = load_bag().dags["fleet_benchmark"]
    assert dag.schedule == "0 2 * * *"  # from include/config/fleet.yaml
    assert dag.catchup is False and dag.max_active_runs == 1
    assert {"fleetbench", "benchmark"} <= set(dag.tags)
    assert dag.default_args["retries"] >= 1
    ids = set(dag.task_ids)
    # Every host's lane is `cases` (host check, images, its runnable cases) -> `run_case`: no task per host
    # outside it; a run is five tasks plus the mapped cases (the comparison with baselines is part of `report`).
    assert ids == {"plan", "host_localhost.cases", "host_localhost.run_case", "store", "report", "outcome"}
    # One lane per host running one case at a time (no pool needed: a missing pool would stall the night).
    assert dag.get_task("host_localhost.run_case").max_active_tis_per_dag == 1
    assert dag.get_task("host_localhost.run_case").pool == "default_pool"
    assert dag.get_task("host_localhost.run_case").task_group.group_id == "host_localhost"
    assert not [t for t in ids if t.startswith("multinode.")]  # no benchmark spans hosts: no multinode group
    # The run's leaves are `outcome`, which runs whatever happened after every task but the report, so a failed
    # task anywhere fails the run, and `report`, which fails the run itself when it fails.
    assert sorted(t.task_id for t in dag.leaves) == ["outcome", "report"]
    assert dag.get_task("outcome").trigger_rule == "all_done"
    assert dag.get_task("outcome").get_flat_relative_ids(upstream=True) == ids - {"outcome", "report"}
    assert dag.get_task("report").trigger_rule == "all_done"
    assert dag.get_task("report").upstream_task_ids == {"plan", "store"}
    assert dag.get_task("report").retries == 0  # a retry would compare the night again (and could mail it twice)
    # The trigger form's params live on the DAG (every task's run merges them); no task carries a copy.
    assert {"hosts", "models", "batch_sizes", "num_gpus", "image", "num_batches", "dry_run"} <= set(dag.params)
    assert all(not t.params for t in dag.tasks)
    # store (collect and store) runs whatever happened to the cases: nothing planned is dropped.
    assert dag.get_task("store").trigger_rule == "all_done"


def test_bad_config_is_the_dag_import_error_with_the_field_path(tmp_path, monkeypatch, no_services):
    bad = {"hosts": [{"name": "localhost"}],
           "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
           "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32, -1]}]}
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", bad)))
    bag = load_bag()
    errors = "\n".join(bag.import_errors.values())
    assert "benchmarks[0].batch_sizes[1]: must be > 0, got -1" in errors
    assert str(tmp_path / "fleet.yaml") in errors


def test_a_large_fleet_has_the_same_lanes_without_task_groups(tmp_path, monkeypatch, no_services):
    """Past MAX_GROUPED_LANES hosts the lanes are plain tasks (faster to parse) with the same ids and pools."""
    hosts = [{"name": f"gpu-{i:03d}", "connection": "local"} for i in range(101)]
    cfg = {"fleet": {"host_pools": True}, "hosts": hosts,
           "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
           "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32]}]}
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", cfg)))
    bag = load_bag()
    assert bag.import_errors == {}
    dag = bag.dags["fleet_benchmark"]
    for host in ("gpu-000", "gpu-100"):
        cases, run = dag.get_task(f"host_{host}.cases"), dag.get_task(f"host_{host}.run_case")
        assert run.pool == cases.pool == f"fleetbench_{host}"  # the host check's GPU containers too
        assert cases.task_group.is_root and run.task_group.is_root
        assert set(run.upstream_task_ids) == {cases.task_id}
        assert cases.host == host
    assert set(dag.task_group.children) == set(dag.task_ids)  # no groups at all
    assert len(dag.tasks) == 2 * 101 + len([t for t in dag.task_ids if not t.startswith("host_")])
    assert sorted(t.task_id for t in dag.leaves) == ["outcome", "report"]


def test_hosts_named_by_their_fqdn_get_lanes(tmp_path, monkeypatch, no_services):
    """Airflow's group ids take no '.': a host named gpu01.lab has the lane host_gpu01_lab (the DAG did not
    import, with an error that named no config field)."""
    cfg = {"fleet": {"host_pools": True}, "hosts": [{"name": "gpu01.lab"}, {"name": "gpu02.lab"}],
           "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
           "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32]}]}
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", cfg)))
    bag = load_bag()
    assert bag.import_errors == {}
    dag = bag.dags["fleet_benchmark"]
    cases, run = dag.get_task("host_gpu01_lab.cases"), dag.get_task("host_gpu01_lab.run_case")
    assert cases.host == "gpu01.lab" and run.pool == cases.pool == "fleetbench_gpu01.lab"
    assert set(run.upstream_task_ids) == {cases.task_id} and cases.task_group.group_id == "host_gpu01_lab"


def test_a_changed_config_is_picked_up_on_the_next_parse(tmp_path, monkeypatch, no_services):
    """The DAG files share one read of an unchanged config per process; an edit shows on the next parse of both."""
    def fleet(*hosts):
        return {"hosts": [{"name": h, "queue": f"q-{h}"} for h in hosts],
                "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
                "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32]}]}

    path = write_config(tmp_path / "fleet.yaml", fleet("a"))
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(path))
    first = load_bag()
    assert "host_a.cases" in first.dags["fleet_benchmark"].task_ids
    assert "clean_q-a" in first.dags["fleetbench_maintenance"].task_ids
    write_config(path, fleet("a", "b"))
    second = load_bag()
    assert second.import_errors == {}
    assert {"host_a.cases", "host_b.cases"} <= set(second.dags["fleet_benchmark"].task_ids)
    assert {"clean_q-a", "clean_q-b"} <= set(second.dags["fleetbench_maintenance"].task_ids)


def test_multinode_cases_run_after_every_lane_one_at_a_time(tmp_path, monkeypatch, no_services):
    """A benchmark with nodes > 1 adds the `multinode` group: after every lane (all_done), one case at a time,
    and its outcomes go to store. Without one, no such task exists (checked in test_fleet_benchmark_shape)."""
    cfg = {"hosts": [{"name": "a"}, {"name": "b", "address": "127.0.0.2"}, {"name": "c"}],
           "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
           "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32], "nodes": [1, 2]}]}
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", cfg)))
    bag = load_bag()
    assert bag.import_errors == {}
    dag = bag.dags["fleet_benchmark"]
    cases, run = dag.get_task("multinode.cases"), dag.get_task("multinode.run_case")
    assert cases.trigger_rule == "all_done"
    assert {f"host_{h}.run_case" for h in "abc"} <= set(cases.upstream_task_ids)
    assert set(run.upstream_task_ids) == {"multinode.cases"}
    assert run.max_active_tis_per_dag == 1
    assert "multinode.run_case" in dag.get_task("store").upstream_task_ids
    assert sorted(t.task_id for t in dag.leaves) == ["outcome", "report"]


def test_maintenance_cleans_each_engine_from_a_worker_that_reaches_it(tmp_path, monkeypatch, no_services):
    """An own-queue host's engine is its machine's socket: its cleaning runs on its queue, the rest on the default."""
    cfg = {"hosts": [{"name": "central"}, {"name": "gpu-b", "queue": "fleet-gpu-b"}],
           "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
           "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32]}]}
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", cfg)))
    bag = load_bag()
    assert bag.import_errors == {}
    dag = bag.dags["fleetbench_maintenance"]
    queues = {t.task_id: t.queue for t in dag.tasks if t.task_id.startswith("clean")}
    assert queues == {"clean": "default", "clean_fleet-gpu-b": "fleet-gpu-b"}


def test_steps_that_could_hang_have_an_execution_timeout(no_services):
    dag = load_bag().dags["fleet_benchmark"]
    assert dag.get_task("host_localhost.cases").host_check_timeout_s == 15 * 60
    assert dag.get_task("store").execution_timeout.total_seconds() == 30 * 60


def test_the_host_check_timeout_leaves_room_for_the_longest_dcgm_diag(tmp_path, monkeypatch, no_services):
    cfg = {"hosts": [{"name": "a"}, {"name": "b", "gpu_health": {"dcgm_diag_level": 3}}],
           "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
           "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32]}]}
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", cfg)))
    dag = load_bag().dags["fleet_benchmark"]
    # each host's check gets its own bound: room for its own longest dcgmi diag
    assert dag.get_task("host_a.cases").host_check_timeout_s == 15 * 60
    assert dag.get_task("host_b.cases").host_check_timeout_s == 15 * 60 + 3600


def test_case_containers_have_a_bounded_engine_log():
    from fleetbench.airflow.operators import BenchmarkCaseOperator

    op = BenchmarkCaseOperator(task_id="t", image="x", command=["true"])
    assert (op.log_opts_max_size, op.log_opts_max_file) == ("100m", "3")


def test_one_engine_that_cannot_be_cleaned_does_not_stop_the_others_of_its_queue(tmp_path, monkeypatch, no_services):
    """A queue's task cleans each of its engines in turn; an unreachable one fails the task at the end, naming it,
    after the others were cleaned (they may hold GPUs with orphaned containers)."""
    from airflow.sdk.exceptions import AirflowException

    from fleetbench import cleanup

    cfg = {"hosts": [{"name": "central"}, {"name": "gpu-b", "queue": "rack-a"}],
           "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
           "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32]}]}
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(write_config(tmp_path / "fleet.yaml", cfg)))
    task = load_bag().dags["fleetbench_maintenance"].get_task("clean_rack-a")
    engines = [{"docker_url": f"tcp://g{i}:2376", "queue": "rack-a", "docker_tls_conn_id": None} for i in (1, 2, 3)]
    monkeypatch.setattr(cleanup, "engines_of", lambda: engines)
    cleaned = []

    def clean_url(url, *args, **kwargs):
        if url == "tcp://g1:2376":
            raise ConnectionError("g1 unreachable")
        cleaned.append(url)
        return {"docker_url": url}

    monkeypatch.setattr(cleanup, "clean_url", clean_url)
    params = {"container_max_age_h": 24, "image_max_age_h": 168, "scope": None, "dry_run": True}
    with pytest.raises(AirflowException, match=r"1 of 3 engine\(s\) of queue rack-a could not be cleaned .*"
                                               r"tcp://g1:2376: g1 unreachable"):
        task.execute({"params": params})
    assert cleaned == ["tcp://g2:2376", "tcp://g3:2376"]


def test_a_whole_engine_cleanup_keeps_what_is_younger_than_an_hour(monkeypatch, caplog):
    """Ages of 0 on the whole engine (no scope) would remove a case container its task is still reading, or a bake a
    night in progress runs; with a scope (a targeted cleanup) they are taken as given."""
    import importlib.util

    from fleetbench import cleanup

    spec = importlib.util.spec_from_file_location("fleetbench_maintenance_dag", DAGS / "fleetbench_maintenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen = []
    monkeypatch.setattr(cleanup, "clean_url", lambda url, c, i, **kw: seen.append((c, i, kw["scope"])) or {})
    module.clean_engine({"docker_url": "unix:///var/run/docker.sock"},
                        {"container_max_age_h": 0, "image_max_age_h": 0, "scope": None, "dry_run": True})
    module.clean_engine({"docker_url": "unix:///var/run/docker.sock"},
                        {"container_max_age_h": 0, "image_max_age_h": 0, "scope": {"t": "1"}, "dry_run": True})
    assert seen == [(1.0, 1.0, None), (0, 0, {"t": "1"})]
    assert "keeps what is younger than 1 h" in caplog.text


def test_store_reads_the_lanes_of_the_runs_plan_not_of_the_config_it_parses(tmp_path, monkeypatch, no_services):
    """Each task parses the DAG file again when it runs: a host removed from the config during the night had no lane
    in the DAG `store` parsed, so its lane's verdict, images and case outcomes were read by nobody and its measured
    cases were stored as host_check_failed, in a run that ended green. `store` reads the plan's lanes by task id."""
    from fleetbench.airflow import pipeline

    def fleet(*hosts):
        return {"hosts": [{"name": h} for h in hosts],
                "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
                "benchmarks": [{"name": "b", "image": "i", "models": ["resnet50"], "batch_sizes": [32]}]}

    path = write_config(tmp_path / "fleet.yaml", fleet("a", "b"))
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(path))
    # the plan task (not parsing) reads the warehouse for its capacity check: an empty one here
    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/w.db")
    plan = pipeline.make_plan({"dag_id": "fleet_benchmark", "run_id": "manual__1", "logical_date":
                               "2026-12-07T02:00:00+00:00", "run_type": "manual"}, str(path))
    write_config(path, fleet("a"))  # gpu b removed while the run is under way
    bag = load_bag()
    store = bag.dags["fleet_benchmark"].get_task("store").python_callable
    pulled = []

    class TI:
        @staticmethod
        def xcom_pull(task_ids, key="return_value"):
            pulled.append((list(task_ids), key))
            return [{"case_key": "k", "host": "b"}] if key == "return_value" else [None] * len(task_ids)

    monkeypatch.setitem(store.__globals__, "get_current_context", lambda: {"ti": TI})
    assert "b" not in store.__globals__["LANES"]
    store.__globals__["from_lanes"]("validation", plan)
    assert pulled[-1] == (["host_a.cases", "host_b.cases"], "validation")
    assert store.__globals__["unparsed_lane_outcomes"](plan) == [{"case_key": "k", "host": "b"}]
    assert pulled[-1] == (["host_b.run_case"], "return_value")
