"""Trigger parameters: the schema Airflow checks at trigger time, and how they narrow the config."""

from __future__ import annotations

import jsonschema
import pytest

from fleetbench.config import ConfigError, parse_config
from fleetbench.params import apply_params, param_specs
from fleetbench.plan import build_plan, expand_cases


def cfg():
    return parse_config({
        "hosts": [{"name": "gpu-01"}, {"name": "gpu-02"}],
        "images": [{"name": "tf1", "ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3",
                    "command": ["python", "tf_cnn_benchmarks.py"]}],
        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50", "vgg16"], "batch_sizes": [32, 64],
                        "num_gpus": [1, 2]},
                       {"name": "cpu", "image": "tf1", "device": "cpu", "models": ["trivial"], "batch_sizes": [8],
                        "num_gpus": [0], "hosts": ["gpu-02"]}],
    })


def planned(config, params: dict) -> list:
    """The cases of a run with these parameters, as the plan task draws them."""
    return build_plan(apply_params(config, params), {"dag_id": "d", "run_id": "r"}, params).cases


def validate(params: dict) -> None:
    """What Airflow does with the trigger form's values (jsonschema on each Param)."""
    for name, spec in param_specs(cfg()).items():
        jsonschema.validate(params.get(name, spec["default"]), spec["schema"])


def test_defaults_validate_and_change_nothing():
    validate({})
    assert expand_cases(apply_params(cfg(), {})) == expand_cases(cfg())


def test_the_trigger_form_offers_the_fleets_hosts_and_models():
    """Airflow's form draws a multi-select for an array with `examples`; its items' enum checks the pick."""
    specs = param_specs(cfg())
    assert specs["hosts"]["schema"]["examples"] == ["gpu-01", "gpu-02"]
    assert specs["models"]["schema"]["examples"] == ["resnet50", "trivial", "vgg16"]
    for name in ("hosts", "models"):
        schema = specs[name]["schema"]
        assert schema["items"]["enum"] == schema["examples"]
        jsonschema.validate(schema["examples"], schema)  # picking every choice is valid
        jsonschema.validate(None, schema)  # what the form sends for a multi-select emptied again
    assert expand_cases(apply_params(cfg(), {"hosts": None, "models": None})) == expand_cases(cfg())


def test_a_large_fleet_gets_no_host_choices():
    from fleetbench.params import MAX_HOST_ENUM

    big = parse_config({"hosts": [{"name": f"gpu-{i:04d}"} for i in range(MAX_HOST_ENUM + 1)],
                        "images": [{"name": "tf1", "ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3",
                                    "command": ["python", "tf_cnn_benchmarks.py"]}],
                        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50"], "batch_sizes": [32],
                                        "num_gpus": [1]}]})
    schema = param_specs(big)["hosts"]["schema"]
    assert "examples" not in schema and "enum" not in schema["items"]


@pytest.mark.parametrize("params", [
    {"models": ["resnet50; rm -rf /"]},
    {"models": ["inception3"]},           # not in the config
    {"hosts": ["gpu-99"]},
    {"hosts": ["$(reboot)"]},
    {"batch_sizes": [0]},
    {"batch_sizes": ["64"]},
    {"num_gpus": [0]},
    {"image": "evil image; rm"},
    {"num_batches": -5},
    {"dry_run": "yes"},
])
def test_bad_values_are_refused_at_trigger_time(params):
    with pytest.raises(jsonschema.ValidationError):
        validate(params)


def test_unknown_names_are_refused_again_at_run_time():
    with pytest.raises(ConfigError) as info:
        apply_params(cfg(), {"models": ["resnet50", "resnet50; rm -rf /"], "hosts": ["gpu-99"]})
    assert info.value.errors == [
        "hosts[0]: unknown host 'gpu-99' (known: gpu-01, gpu-02)",
        "models[1]: unknown model 'resnet50; rm -rf /' (known: resnet50, trivial, vgg16)"]
    with pytest.raises(ConfigError,
                       match="after applying the run's parameters: images\\[0\\].ref: must be a Docker image"):
        apply_params(cfg(), {"image": "bad ref; rm"})


def test_subset_and_overrides():
    params = {"hosts": ["gpu-01"], "models": ["vgg16"], "batch_sizes": [128], "num_gpus": [4], "num_batches": 20,
              "image": "nvcr.io/nvidia/tensorflow:24.01-tf1-py3"}
    narrowed = apply_params(cfg(), params)
    cases = planned(cfg(), params)
    assert [(c.host, c.case_key) for c in cases] == [("gpu-01", "cnn.vgg16.bs128.g4.parameter_server.nb20")]
    assert "--num_batches=20" in cases[0].command
    assert narrowed.images[0].ref == "nvcr.io/nvidia/tensorflow:24.01-tf1-py3"


def test_an_image_override_replaces_only_the_images_the_run_uses():
    """A fleet of two repositories: with the run narrowed to the TF benchmark, a TF tag is a valid override; the
    PyTorch image the run does not use is neither replaced nor a reason to refuse (it was: same_repository)."""
    data = cfg().model_dump(mode="json", exclude_none=True)
    data["images"].append({"name": "pt", "ref": "nvcr.io/nvidia/pytorch:25.01-py3", "command": ["python", "b.py"]})
    data["benchmarks"].append({"name": "pt", "image": "pt", "harness": "command", "num_gpus": [1]})
    mixed = parse_config(data)
    narrowed = apply_params(mixed, {"models": ["vgg16"], "image": "nvcr.io/nvidia/tensorflow:24.01-tf1-py3"})
    assert {i.name: i.ref for i in narrowed.images} == {"tf1": "nvcr.io/nvidia/tensorflow:24.01-tf1-py3",
                                                        "pt": "nvcr.io/nvidia/pytorch:25.01-py3"}
    with pytest.raises(ConfigError, match=r"cannot replace images\[1\] \(pt"):  # the run uses both: still refused
        apply_params(mixed, {"image": "nvcr.io/nvidia/tensorflow:24.01-tf1-py3"})


def test_benchmarks_emptied_by_the_subset_drop_out():
    cases = planned(cfg(), {"hosts": ["gpu-02"], "models": ["trivial"]})
    assert [(c.host, c.model, c.num_gpus) for c in cases] == [("gpu-02", "trivial", 0)]
    with pytest.raises(ConfigError, match="no benchmark is left"):
        apply_params(cfg(), {"hosts": ["gpu-01"], "models": ["trivial"]})


def test_repeated_values_are_refused_at_run_time_not_in_the_plan():
    """The trigger form's uniqueItems is not the only way in (CLI, API): the config's own check catches repeats."""
    with pytest.raises(ConfigError) as info:
        apply_params(cfg(), {"batch_sizes": [64, 64], "num_gpus": [2, 2]})
    assert info.value.errors == [
        "after applying the run's parameters: benchmarks[0].batch_sizes: must not repeat a value: 64 at [0] and [1]",
        "after applying the run's parameters: benchmarks[0].num_gpus: must not repeat a value: 2 at [0] and [1]",
        "after applying the run's parameters: benchmarks[1].batch_sizes: must not repeat a value: 64 at [0] and [1]",
    ]


def test_accept_baselines_names_hosts_of_the_config():
    """A host or host/case_key; at trigger time only the config's host names pass, at run time again."""
    from fleetbench.params import accept_targets

    validate({"accept_baselines": ["gpu-01", "gpu-02/tf.resnet50.bs64.g1.replicated"]})
    for bad in (["gpu-99"], ["gpu-01/"], ["gpu-01/a b"], ["gpu-0"], ["gpu-011"], ["gpu-01/x/y"], "gpu-01", [3]):
        with pytest.raises(jsonschema.ValidationError):
            validate({"accept_baselines": bad})
    with pytest.raises(ConfigError) as info:
        apply_params(cfg(), {"accept_baselines": ["gpu-99/x", "a b"]})
    assert info.value.errors == ["accept_baselines[0]: unknown host 'gpu-99' (known: gpu-01, gpu-02)",
                                 "accept_baselines[1]: 'a b' is not a host or host/case_key"]
    assert expand_cases(apply_params(cfg(), {"accept_baselines": ["gpu-01"]})) == expand_cases(cfg())
    assert accept_targets(["gpu-01", "gpu-02/c.g1"]) == [("gpu-01", None), ("gpu-02", "c.g1")]


def test_multi_node_case_keys_can_be_named():
    """A multi-node case's key names its host set with `+` (fleetbench.multinode.set_case_key): force_cases and
    accept_baselines take it, at trigger time and at run time (both refused every such key before)."""
    from fleetbench.multinode import set_case_key

    key = set_case_key("cnn.resnet50.bs64.g1.distributed_replicated", ["gpu-01", "gpu-02"])
    validate({"force_cases": [key, f"gpu-01/{key}"], "accept_baselines": [f"gpu-01/{key}"]})
    apply_params(cfg(), {"accept_baselines": [f"gpu-01/{key}"], "force_cases": [key, f"gpu-01/{key}"]})


def test_accept_baselines_of_a_large_fleet_is_checked_when_the_run_starts():
    from fleetbench.params import ACCEPT_PATTERN, MAX_HOST_ENUM

    big = parse_config({"hosts": [{"name": f"gpu-{i:04d}"} for i in range(MAX_HOST_ENUM + 1)],
                        "images": [{"name": "tf1", "ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3",
                                    "command": ["python", "tf_cnn_benchmarks.py"]}],
                        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50"], "batch_sizes": [32],
                                        "num_gpus": [1]}]})
    schema = param_specs(big)["accept_baselines"]["schema"]
    assert schema["items"]["pattern"] == ACCEPT_PATTERN
    jsonschema.validate(["gpu-9999"], schema)
    with pytest.raises(ConfigError, match="unknown host 'gpu-9999'") as info:
        apply_params(big, {"accept_baselines": ["gpu-9999"]})
    # the error names 20 of the fleet's hosts and how many there are (all 101 made it 1.4 KB, 10 KB at 1,000)
    assert "(known: gpu-0000, gpu-0001," in str(info.value) and "gpu-0019, ... (101 in all))" in str(info.value)
    assert "gpu-0020" not in str(info.value)


@pytest.mark.parametrize("name", ["batch_sizes", "num_gpus", "force_cases", "accept_baselines"])
def test_a_list_cleared_in_the_trigger_form_means_its_default(name):
    """The form sends null for a list typed in and cleared again: it was refused ('None is not of type array') as it
    was not for hosts and models, and the form could not go back to []."""
    validate({name: None})
    assert expand_cases(apply_params(cfg(), {name: None})) == expand_cases(cfg())


def test_the_hosts_parameter_keeps_the_configured_multi_node_sets_it_names_every_host_of(caplog):
    """Nightly, gpu-01..04 with nodes [1, 2] pair gpu-01+gpu-02 and gpu-03+gpu-04. A rerun of gpu-01, gpu-03 and
    gpu-04 runs gpu-03+gpu-04, not gpu-01+gpu-03 (a set the nightly never runs, with no history), and logs the
    set it leaves out."""
    data = cfg().model_dump(mode="json", exclude_none=True)
    data["hosts"] = [{"name": f"gpu-0{i}", "address": f"10.0.0.{i}", "connection": f"ssh_{i}"} for i in range(1, 5)]
    data["benchmarks"] = [{"name": "cnn", "image": "tf1", "models": ["resnet50"], "batch_sizes": [64],
                           "num_gpus": [8], "nodes": [1, 2]}]
    fleet = parse_config(data)
    nightly = {c.case_key for c in planned(fleet, {}) if c.nodes > 1}
    assert nightly == {"cnn.resnet50.bs64.g8.parameter_server.n2.gpu-01+gpu-02",
                       "cnn.resnet50.bs64.g8.parameter_server.n2.gpu-03+gpu-04"}
    with caplog.at_level("WARNING", logger="fleetbench.plan"):
        rerun = planned(fleet, {"hosts": ["gpu-01", "gpu-03", "gpu-04"]})
    assert sorted((c.host, c.case_key) for c in rerun) == [
        ("gpu-01", "cnn.resnet50.bs64.g8.parameter_server"), ("gpu-03", "cnn.resnet50.bs64.g8.parameter_server"),
        ("gpu-03", "cnn.resnet50.bs64.g8.parameter_server.n2.gpu-03+gpu-04"),
        ("gpu-04", "cnn.resnet50.bs64.g8.parameter_server")]
    assert "benchmark cnn's set gpu-01+gpu-02 is left out: gpu-02 not asked for" in caplog.text
    assert [c.case_key for c in planned(fleet, {"hosts": ["gpu-01"]}) if c.nodes > 1] == []
    plan = build_plan(apply_params(fleet, {"hosts": ["gpu-04", "gpu-03"]}), {"dag_id": "d", "run_id": "r"},
                      {"hosts": ["gpu-04", "gpu-03"]})
    assert [h.name for h in plan.hosts] == ["gpu-03", "gpu-04"]  # only the asked hosts are validated and run


def test_a_num_batches_override_plans_cases_of_their_own_apart_from_the_nightly():
    """A quick check with 10 batches must not join the 100-batch nightly's history under its keys (its duration
    and cost would be a false improvement at once): a case run with another number than its benchmark's has the
    key `<key>.nb<N>`. The same number as configured is the nightly case; harnesses that do not pass num_batches
    (nccl_tests, command) keep theirs."""
    data = cfg().model_dump(mode="json", exclude_none=True)
    data["hosts"] = [{"name": h, "address": f"10.0.0.{i}", "connection": f"ssh_{i}"}
                     for i, h in enumerate(("gpu-01", "gpu-02"))]
    data["benchmarks"][0].update(models=["vgg16"], batch_sizes=[32], num_gpus=[1], nodes=[1, 2])
    data["images"].append({"name": "pt", "ref": "nvcr.io/nvidia/pytorch:25.01-py3", "command": ["python", "t.py"]})
    data["benchmarks"] += [
        {"name": "pt", "image": "pt", "harness": "torch_synthetic", "models": ["resnet50"], "batch_sizes": [32],
         "num_batches": 10, "mig_profiles": ["1g.10gb"]},
        {"name": "nccl", "image": "pt", "harness": "nccl_tests", "collectives": ["all_reduce"]}]
    fleet = parse_config(data)
    nightly = {(c.host, c.case_key): c for c in planned(fleet, {})}
    manual = {(c.host, c.case_key): c for c in planned(fleet, {"num_batches": 10})}
    assert {k: c.num_batches for k, c in manual.items() if k[0] == "gpu-01"} == {
        ("gpu-01", "cnn.vgg16.bs32.g1.parameter_server.nb10"): 10,
        ("gpu-01", "cnn.vgg16.bs32.g1.parameter_server.nb10.n2.gpu-01+gpu-02"): 10,
        ("gpu-01", "pt.resnet50.bs32.g1.fp32.nchw.eager.mig-1g.10gb"): 10,  # its own number: the nightly case
        ("gpu-01", "nccl.all_reduce.g1.8-128M"): 100}  # nccl-tests takes no number of batches
    cnn = manual[("gpu-01", "cnn.vgg16.bs32.g1.parameter_server.nb10")]
    assert "--num_batches=10" in cnn.command and "--num_batches=100" in nightly[
        ("gpu-01", "cnn.vgg16.bs32.g1.parameter_server")].command
    changed = {k for k, c in manual.items() if c.num_batches != nightly.get(k, c).num_batches}
    assert not changed and not {k for k, c in manual.items() if c.harness == "tf_cnn_benchmarks"} & set(nightly)
    hundred = {c.benchmark: c for c in planned(fleet, {"num_batches": 100}) if c.host == "gpu-01" and c.nodes == 1}
    assert hundred["cnn"] == nightly[("gpu-01", "cnn.vgg16.bs32.g1.parameter_server")]  # cnn's own number
    assert hundred["pt"].case_key == "pt.resnet50.bs32.g1.fp32.nchw.eager.nb100.mig-1g.10gb"
    for bad in (0, True, "10", 10**7):
        with pytest.raises(ConfigError) as info:
            apply_params(fleet, {"num_batches": bad})
        assert info.value.errors == [f"num_batches: must be an integer from 1 to 1000000, got {bad!r}"]


def test_a_whole_num_batches_sent_as_a_float_plans_as_the_integer(tmp_path, monkeypatch):
    """JSON Schema, as Airflow's trigger check applies it, counts 20.0 as an integer (a REST client or `-c` conf may
    send one): the run was created and its plan task failed ("must be an integer"). It plans as 20; 20.5 is refused."""
    import yaml

    from fleetbench.airflow.pipeline import make_plan
    from fleetbench.run_model import RunPlan

    validate({"num_batches": 20.0})  # passes the trigger check, as before
    apply_params(cfg(), {"num_batches": 20.0})
    with pytest.raises(ConfigError, match=r"num_batches: must be an integer from 1 to \d+, got 20.5"):
        apply_params(cfg(), {"num_batches": 20.5})
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(cfg().model_dump(mode="json", by_alias=True, exclude_none=True)))
    monkeypatch.setenv("FLEETBENCH_DATA_DIR", str(tmp_path))
    plans = [RunPlan.load(make_plan({"dag_id": "d", "run_id": "r"}, str(path), {"num_batches": n})) for n in (20.0, 20)]
    assert [[(c.host, c.case_key, c.command) for c in p.cases] for p in plans][0] == [
        (c.host, c.case_key, c.command) for c in plans[1].cases]
    assert all(c.case_key.endswith(".nb20") and "--num_batches=20" in c.command for c in plans[0].cases)
