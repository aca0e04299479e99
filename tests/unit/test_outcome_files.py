"""`store` reads a case's outcome file when its task returned nothing; the file must be this execution's: a cleared
or re-backfilled run reuses the run's folder, and an earlier execution's file there is not this one's result."""

from __future__ import annotations

import json

import pytest

from fault_runs import measured_outcomes, night


@pytest.mark.parametrize("stamp, status, failure_class", [
    ("earlier", "failed", "task_failed"),  # this execution's task never ran the case
    ("this", "ok", None),  # its task wrote the file and died before returning
    (None, "ok", None),  # a file written before outcomes were stamped
])
def test_an_outcome_file_of_an_earlier_execution_is_not_this_runs_result(tmp_path, data_dir, stamp, status,
                                                                         failure_class):
    from fleetbench.airflow.pipeline import collect
    from fleetbench.runs import case_log_dir, outcome_path

    plan, validations, prepared = night(tmp_path, "r1")
    [case] = plan["cases"]
    [outcome] = measured_outcomes(plan)
    if stamp is not None:
        outcome["run_started_at"] = plan["run"]["started_at"] if stamp == "this" else "2026-11-01T02:00:00+00:00"
    path = outcome_path(case_log_dir("fleet_benchmark", "r1", case["host"]), case["case_key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outcome))
    [row] = collect(plan, validations, prepared, [])["rows"]
    assert (row["status"], row["failure_class"]) == (status, failure_class)
    assert plan["run"]["started_at"]  # the plan stamps its execution


def test_each_case_task_stamps_its_outcome_with_the_runs_execution(tmp_path, data_dir):
    from fleetbench.airflow.operators import BenchmarkCaseOperator, case_kwargs

    plan, validations, prepared = night(tmp_path, "r1")
    [kwargs] = case_kwargs(plan, validations, prepared, host="localhost")
    assert kwargs["case"]["run_started_at"] == plan["run"]["started_at"]
    op = BenchmarkCaseOperator(task_id="run_case", **kwargs)
    assert op._blank_outcome()["run_started_at"] == plan["run"]["started_at"]


def test_a_host_added_to_the_config_after_the_dag_was_parsed_fails_the_plan_naming_it(tmp_path, data_dir):
    """The plan reads the config when the run starts, the scheduler made the run's tasks from the DAG as last parsed:
    a host added in between had no lane, and its cases were recorded as host_check_failed in a run that succeeded."""
    from fleetbench.airflow.pipeline import check_lanes

    plan, _, _ = night(tmp_path, "r1")
    check_lanes(plan, ["plan", "host_localhost.cases", "host_localhost.run_case", "store"])
    with pytest.raises(ValueError, match=r"host\(s\) localhost of the fleet config have no lane in this run"):
        check_lanes(plan, ["plan", "host_gpu-a.cases", "store"])


def test_a_baked_images_inputs_and_harness_revision_are_on_its_rows(tmp_path, data_dir):
    from fleetbench.airflow.pipeline import collect

    plan, validations, prepared = night(tmp_path, "r1")
    prepared[0]["images"]["cpu-smoke"].update(bake_inputs="b" * 64, harness_revision="c" * 40)
    [row] = collect(plan, validations, prepared, measured_outcomes(plan))["rows"]
    assert (row["status"], row["bake_inputs"], row["harness_revision"]) == ("ok", "b" * 64, "c" * 40)


def test_the_orphan_sweep_is_best_effort(tmp_path, data_dir):
    """An engine that refuses the listing before a case does not make the case a start failure: the sweep gives up."""
    from docker.errors import APIError

    from fleetbench.airflow.operators import BenchmarkCaseOperator, case_kwargs

    plan, validations, prepared = night(tmp_path, "r1")
    [kwargs] = case_kwargs(plan, validations, prepared, host="localhost")
    op = BenchmarkCaseOperator(task_id="run_case", **kwargs)

    class Refusing:
        def containers(self, **kwargs):
            raise APIError("500 Server Error: listing refused")

    op.__dict__["cli"] = Refusing()  # the cached client
    op._remove_orphans()  # returns, raises nothing


def test_an_earlier_executions_outcome_from_xcom_never_replaces_this_ones(tmp_path, data_dir):
    """A cleared or re-backfilled run whose host now has fewer cases: Airflow marks the lane's map indexes past the
    new count removed and keeps their XComs, so the lane's outcomes hold the earlier execution's after this one's.
    The earlier one (the old driver's measurement) replaced this night's, labelled with the new host check."""
    from fleetbench.airflow.pipeline import collect

    plan, validations, prepared = night(tmp_path, "r1")
    [fresh] = measured_outcomes(plan)
    fresh["run_started_at"] = plan["run"]["started_at"]
    stale = {**json.loads(json.dumps(fresh)), "run_started_at": "2026-11-01T02:00:00+00:00", "exit_code": 137,
             "oom_killed": True}
    [row] = collect(plan, validations, prepared, [fresh, stale])["rows"]
    assert (row["status"], row["failure_class"], row["exit_code"]) == ("ok", None, 0)
    # only the earlier execution's outcome: this one's case task never reported it
    [row] = collect(plan, validations, prepared, [stale])["rows"]
    assert (row["status"], row["failure_class"]) == ("failed", "task_failed")


def test_names_cut_to_120_characters_stay_apart():
    """Two case keys of one host that differ only past the cut shared a container name (and a log folder name where
    a run id did): each keeps a digest of the whole now; a name within 120 characters is as it was."""
    from fleetbench.runs import container_name, safe_name

    host = "gpu-node-" + "x" * 54
    a = container_name("fleet_benchmark", "r1", host, "torch.resnet152.bs256.g8.bf16.nhwc.compiled.long")
    b = container_name("fleet_benchmark", "r1", host, "torch.resnet152.bs256.g8.bf16.nhwc.compiled.longer")
    assert a != b and len(a) == len(b) == 120
    assert a[:111] == b[:111]  # the same up to the cut: only the digest tells them apart
    assert safe_name("scheduled__2026-11-02T02:00:00+00:00") == "scheduled__2026-11-02T02_00_00_00_00"
    assert safe_name("x" * 120) == "x" * 120 and safe_name("") == "x"


def test_a_case_key_too_long_for_a_file_name_gets_a_short_stem(tmp_path):
    """A 4-host set of 48-character host names has a 241-character case key (within the column's 250): its role logs
    (`<key>.worker1.log.tmp`, 257 bytes) failed with ENAMETOOLONG after the case had run, losing its result."""
    from fleetbench.airflow.multinode import MultiNodeCaseOperator
    from fleetbench.multinode import layout, set_case_key
    from fleetbench.runs import file_stem, log_path, outcome_path

    hosts = [f"gpu-h100-0{i}.rack07.fra2.prod.cluster.example.net" for i in range(4)]
    key = set_case_key("cnn-dist.resnet50.bs64.g8.parameter_server", hosts)
    assert 240 <= len(key) <= 250
    stem = file_stem(key)
    assert len(stem) == 200 and stem != file_stem(key[:-1] + "x") and file_stem("short.key") == "short.key"
    roles = [{**r, "docker_url": "unix:///var/run/docker.sock", "address": "10.0.0.1", "image": "x",
              "container_name": f"c{i}", "labels": {}} for i, r in enumerate(layout(hosts, 1, 1))]
    op = MultiNodeCaseOperator(task_id="mn", case={"host": hosts[0], "case_key": key}, command=["python3"],
                               roles=roles, cluster={}, timeout_s=60, log_dir=str(tmp_path))
    for path in [log_path(tmp_path, key), outcome_path(tmp_path, key), *(op._role_log(r) for r in roles)]:
        path.with_suffix(path.suffix + ".tmp").write_text("x")  # each name fits, with the longest suffix
        path.write_text("x")


def test_a_case_task_times_out_by_its_own_cases_timeout_as_planned(tmp_path, data_dir):
    """The DAG gives every case task its longest case's timeout from the config as each task parses it: lowered during
    a night (7200 s -> 600 s), it killed the rest of the night's cases after 15 minutes, each twice with its retry.
    Running, a case task's execution_timeout is its own case's, as the run's plan has it."""
    from datetime import timedelta

    from fleetbench.airflow.multinode import MultiNodeCaseOperator
    from fleetbench.airflow.operators import EXECUTION_GRACE_S, BenchmarkCaseOperator, case_kwargs

    plan, validations, prepared = night(tmp_path, "r1")
    [kwargs] = case_kwargs(plan, validations, prepared, host="localhost")
    kwargs["timeout_s"] = 7200
    op = BenchmarkCaseOperator(task_id="run_case", execution_timeout=timedelta(seconds=900),
                               execution_grace_s=EXECUTION_GRACE_S, **kwargs)
    assert op.execution_timeout == timedelta(seconds=7200 + EXECUTION_GRACE_S)
    # without a grace, the execution_timeout given stands (a task of another DAG, a fault test's 4 s)
    assert BenchmarkCaseOperator(task_id="r2", execution_timeout=timedelta(seconds=4), **kwargs).execution_timeout \
        == timedelta(seconds=4)
    multi = MultiNodeCaseOperator(task_id="m", case={}, command=["true"], roles=[], cluster={}, timeout_s=7200,
                                  log_dir=str(tmp_path), execution_timeout=timedelta(seconds=900),
                                  execution_grace_s=EXECUTION_GRACE_S)
    assert multi.execution_timeout == timedelta(seconds=7200 + EXECUTION_GRACE_S)
    # the DAG's case tasks take the grace
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags")).dags["fleet_benchmark"]
    assert dag.get_task("host_localhost.run_case").partial_kwargs["execution_grace_s"] == EXECUTION_GRACE_S


def test_a_lanes_cases_task_reads_the_plan_once_and_hands_on_the_hosts_cases(tmp_path, data_dir, monkeypatch):
    """The lane's `cases` task: the host's check and images pushed, its cases returned as the mapped tasks'
    arguments; the plan (57 MB at 1,000 hosts) validated once, not in each of four steps."""
    from fleetbench.airflow import pipeline
    from fleetbench.airflow.operators import LANE_IMAGES, LANE_VALIDATION, LaneCasesOperator
    from fleetbench.run_model import RunPlan

    plan, validations, prepared = night(tmp_path, "r1", batch_sizes=(8, 16))
    loads = []
    real_validate = RunPlan.model_validate
    monkeypatch.setattr(RunPlan, "model_validate", classmethod(
        lambda cls, value, **kw: loads.append(1) or real_validate.__func__(cls, value, **kw)))
    monkeypatch.setattr(pipeline, "validate_host", lambda host, run, timeout_s=None: validations[0])
    monkeypatch.setattr(pipeline, "prepare_host_images", lambda host, vs, needed=None: prepared[0])

    class TI:
        pushed: dict = {}

        def xcom_push(self, key, value):
            self.pushed[key] = value

    ti = TI()
    op = LaneCasesOperator(task_id="cases", host="localhost", plan=plan)
    out = op.execute({"ti": ti})
    assert [k["case"]["case_key"] for k in out] == [c["case_key"] for c in plan["cases"]] and len(out) == 2
    assert ti.pushed == {LANE_VALIDATION: validations[0], LANE_IMAGES: prepared[0]}
    assert len(loads) == 1
