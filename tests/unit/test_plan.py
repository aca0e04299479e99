"""Plan expansion: the matrix, stable case keys, argument-list commands."""

from __future__ import annotations

import pytest

from fleetbench.config import ConfigError, parse_config
from fleetbench.plan import expand_cases


def config(**bench) -> dict:
    return {
        "hosts": [{"name": "a"}, {"name": "b"}],
        "images": [{"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "command": ["python", "/b/tf_cnn_benchmarks.py"]}],
        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50", "vgg16"], "batch_sizes": [32, 64],
                        "num_gpus": [1, 2], "variable_update": ["replicated"], **bench}],
    }


def test_matrix_is_hosts_x_models_x_gpus_x_batches_in_order():
    cases = expand_cases(parse_config(config()))
    assert len(cases) == 2 * 2 * 2 * 2
    assert cases[0].case_key == "cnn.resnet50.bs32.g1.replicated"
    assert [c.case_key for c in cases[:4]] == [
        "cnn.resnet50.bs32.g1.replicated", "cnn.resnet50.bs64.g1.replicated",
        "cnn.resnet50.bs32.g2.replicated", "cnn.resnet50.bs64.g2.replicated"]
    assert {c.host for c in cases} == {"a", "b"}
    assert len({(c.host, c.case_key) for c in cases}) == len(cases)


def test_plan_is_deterministic():
    assert ([c.to_dict() for c in expand_cases(parse_config(config()))]
            == [c.to_dict() for c in expand_cases(parse_config(config()))])


def test_gpu_command_line():
    case = expand_cases(parse_config(config()))[3]
    assert case.command == ["python", "/b/tf_cnn_benchmarks.py", "--model=resnet50", "--batch_size=64",
                            "--num_batches=100", "--num_warmup_batches=5", "--variable_update=replicated",
                            "--device=gpu", "--num_gpus=2"]
    assert case.batch_size_global == 128


def test_cpu_cases_run_one_cpu_device():
    case = expand_cases(parse_config(config(device="cpu", num_gpus=[0], extra_args=["--display_every=5"])))[0]
    assert case.num_gpus == 0 and case.batch_size_global == 32
    assert case.command[-4:] == ["--device=cpu", "--num_gpus=1", "--data_format=NHWC", "--display_every=5"]


def test_host_and_model_filters():
    cfg = parse_config(config(hosts=["b"]))
    assert {c.host for c in expand_cases(cfg)} == {"b"}
    assert {c.model for c in expand_cases(parse_config(config()), models=["vgg16"])} == {"vgg16"}
    assert expand_cases(parse_config(config()), hosts=["zzz"]) == []


def test_gpu_and_cpu_cases_keep_their_telemetry_period():
    gpu = expand_cases(parse_config(config(telemetry_period_s=0.2)))
    assert {c.telemetry_period_s for c in gpu} == {0.2}
    cpu = expand_cases(parse_config(config(device="cpu", num_gpus=[0], telemetry_period_s=0.2)))
    assert {c.telemetry_period_s for c in cpu} == {0.2}  # the wrapper counts CPU time (without NVML)


def test_a_valid_config_never_plans_the_same_case_twice():
    """Repeats in a benchmark's lists are config errors, so expand_cases' duplicate check cannot fire at run time."""
    for field, values in (("models", ["vgg16", "vgg16"]), ("batch_sizes", [32, 32]), ("num_gpus", [2, 2]),
                          ("variable_update", ["replicated", "replicated"])):
        with pytest.raises(ConfigError, match=f"benchmarks\\[0\\].{field}: must not repeat a value"):
            parse_config(config(**{field: values}))


def test_steps_after_a_failed_plan_say_so(tmp_path, monkeypatch):
    """collect and store run whatever happened upstream: without a plan (or rows) they fail naming the task."""
    from fleetbench.airflow.pipeline import collect, store
    from fleetbench.run_model import MissingPlan

    monkeypatch.setenv("FLEETBENCH_WAREHOUSE_URL", f"sqlite:///{tmp_path}/w.db")
    with pytest.raises(MissingPlan, match="the `plan` task failed"):
        collect(None, [], [], [])
    with pytest.raises(MissingPlan, match="the `plan` task failed"):
        store(None, {"rows": [], "steps": [], "metrics": [], "validations": []})
    assert not (tmp_path / "w.db").exists()  # nothing written

    from fleet_configs import write_config
    from fleetbench.airflow.pipeline import make_plan

    plan = make_plan({"dag_id": "fleet_benchmark", "run_id": "r1"}, str(write_config(tmp_path / "f.yaml", config())))
    with pytest.raises(RuntimeError, match="the collect step did not finish"):
        store(plan, None)


def test_a_host_check_that_does_not_end_is_a_verdict_not_a_hung_lane(tmp_path, monkeypatch):
    """The lane's bound on the host check (`host_check_timeout_s`): a probe still running when it passes is killed,
    the check ends with an unfit verdict that says why, and the lane goes on (to record the host's cases as
    unfit). The probes' runners catch OSErrors (TimeoutError is one) to record a failed probe and go on: the
    deadline must get through them, or the next probe could hang in its turn."""
    import signal
    import time

    from fleet_configs import write_config
    from fleetbench.airflow.pipeline import make_plan, validate_host
    from fleetbench.run_model import HostVerdict

    monkeypatch.setenv("FLEETBENCH_DATA_DIR", str(tmp_path / "data"))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text("#!/bin/sh\nexec /bin/sleep 30\n")  # the first probe hangs
    (fake / "uname").chmod(0o755)
    cfg = config()
    cfg["hosts"] = [{"name": "a", "connection": "local", "probe_path": [str(fake)]}]
    plan = make_plan({"dag_id": "fleet_benchmark", "run_id": "r1"}, str(write_config(tmp_path / "f.yaml", cfg)))

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))  # an outer alarm, as execution_timeout's
    signal.setitimer(signal.ITIMER_REAL, 4.0)
    try:
        started = time.monotonic()
        verdict = HostVerdict.load(validate_host(plan["hosts"][0], plan["run"], timeout_s=1))
        took = time.monotonic() - started
        assert took < 3, took  # one probe's deadline, not a 30 s sleep per probe
        assert verdict.verdict == "unfit"
        assert "did not end within 1 s" in verdict.reasons
        time.sleep(4.5 - took)
        assert fired == [1]  # the outer alarm was set again for the time it had left
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_hosts_parameter_that_leaves_no_case_names_the_parameter_not_the_config(tmp_path):
    """A multi-node set runs only whole: `hosts: [a]` leaves the a+b set out, and the plan is empty because of the
    run's parameter, which the error names (it pointed at the config's benchmarks[*].hosts)."""
    from fleet_configs import write_config
    from fleetbench.airflow.pipeline import make_plan
    from fleetbench.params import DEFAULTS

    path = str(write_config(tmp_path / "f.yaml", config(nodes=[2], num_gpus=[1], models=["resnet50"],
                                                        batch_sizes=[32], variable_update=["distributed_replicated"])))
    assert make_plan({"dag_id": "fleet_benchmark", "run_id": "r0"}, path)["cases"]  # the set runs without it
    with pytest.raises(ValueError, match=r"hosts parameter \['a'\]: no case of .*f\.yaml is left on these hosts"):
        make_plan({"dag_id": "fleet_benchmark", "run_id": "r1"}, path, {**DEFAULTS, "hosts": ["a"]})


def test_a_dry_run_with_a_host_without_verdict_fails_naming_it(tmp_path):
    """A dry run stops after the verdicts: in `store` (every lane's), a planned host whose check never gave one fails
    the run, named; a lane's own call (its verdict only) just stops."""
    from airflow.sdk.exceptions import AirflowFailException

    from fleet_configs import write_config
    from fleetbench.airflow.pipeline import make_plan, proceed
    from fleetbench.params import DEFAULTS
    from fleetbench.run_model import HostVerdict

    path = str(write_config(tmp_path / "f.yaml", config()))
    plan = make_plan({"dag_id": "fleet_benchmark", "run_id": "r1"}, path, {**DEFAULTS, "dry_run": True})
    a = HostVerdict(host="a", verdict="ready", reasons="").to_xcom()
    assert proceed(plan, [a]) is False
    with pytest.raises(AirflowFailException, match=r"^dry run: the check of host\(s\) b did not finish \(see the task "
                                                    r"log of host_b.cases\)$"):
        proceed(plan, [a, None], whole_run=True)
    b = HostVerdict(host="b", verdict="unfit", reasons="gpu_count: 0 GPU(s)").to_xcom()
    assert proceed(plan, [a, b], whole_run=True) is False
    assert proceed(make_plan({"dag_id": "fleet_benchmark", "run_id": "r2"}, path), [None], whole_run=True) is True
