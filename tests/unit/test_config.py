"""Fleet config validation: good files load, every mistake names its field, `config check` never tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetbench.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
FLEETBENCH = [str(Path(sys.executable).parent / "fleetbench")]


def good() -> dict:
    return {
        "hosts": [{"name": "gpu-01", "connection": "ssh_gpu_01", "docker_url": "tcp://gpu-01:2376"}],
        "images": [{"name": "tf1", "ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3", "cuda": "12.1",
                    "command": ["python", "/workspace/tf_cnn_benchmarks.py"]}],
        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50", "vgg16"], "batch_sizes": [32, 64],
                        "num_gpus": [1, 2], "variable_update": ["replicated"]}],
    }


def errors_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "fleet.yaml")
    return info.value.errors


@pytest.mark.parametrize("path", sorted((ROOT / "include" / "config").glob("fleet*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    cfg = load_config(path)
    assert cfg.hosts and cfg.benchmarks


def test_defaults():
    cfg = parse_config(good())
    assert cfg.fleet.schedule == "0 2 * * *" and cfg.fleet.timezone == "UTC"
    assert cfg.images[0].pull_policy == "always"
    assert cfg.benchmarks[0].num_batches == 100 and cfg.benchmarks[0].timeout_s == 3600


@pytest.mark.parametrize("fleet, warned", [
    ({}, False),  # nightly, 120 days
    ({"schedule": "0 2 * * 1"}, False),  # weekly, 120 days: 17 nights
    ({"schedule": "0 2 * * 1", "regressions": {"history_days": 60}}, True),  # 8 nights, min_history 10
    ({"schedule": "@monthly"}, True),  # 4 nights in 120 days
    ({"schedule": "0 2 * * 1", "regressions": {"history_days": 60, "min_history": 5, "window": 10}}, False),
    ({"schedule": None, "regressions": {"history_days": 7}}, False),  # manual runs only: no schedule to count
])
def test_a_history_too_short_for_the_schedule_is_warned_of(fleet, warned):
    from fleetbench.config import config_warnings

    data = good()
    data["fleet"] = fleet
    got = [w for w in config_warnings(parse_config(data)) if w.startswith("fleet.regressions.history_days")]
    assert bool(got) == warned, got
    if warned:
        assert "no case is ever compared with a baseline" in got[0]


@pytest.mark.parametrize("schedule", ["@weekly", "@quarterly", "@midnight", "@annually", "30 1 * * 1-5", "0 2 29 2 *",
                                      "*/15 * * * *", "0 2 * * MON", None])
def test_schedules_airflow_takes_are_accepted(schedule):
    data = good()
    data["fleet"] = {"schedule": schedule}
    assert parse_config(data).fleet.schedule == schedule


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["benchmarks"][0]["batch_sizes"].__setitem__(1, -1),
     "benchmarks[0].batch_sizes[1]: must be > 0, got -1"),
    (lambda d: d["benchmarks"][0]["models"].append("resnet50; rm -rf /"),
     "benchmarks[0].models[2]: must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$, got 'resnet50; rm -rf /'"),
    (lambda d: d["benchmarks"][0].update(image="tf2"), "benchmarks[0].image: unknown image 'tf2' (known: tf1)"),
    (lambda d: d["benchmarks"][0].update(hosts=["gpu-02"]),
     "benchmarks[0].hosts[0]: unknown host 'gpu-02' (known: gpu-01)"),
    (lambda d: d["hosts"].append({"name": "gpu-01"}), "hosts[1].name: duplicate name 'gpu-01'"),
    (lambda d: d["images"][0].update(pull_policy="sometimes"),
     "images[0].pull_policy: must be one of 'always', 'if-missing' or 'never', got 'sometimes'"),
    (lambda d: d["images"][0].update(cuda="twelve"), "images[0].cuda: must match ^\\d+\\.\\d+$, got 'twelve'"),
    (lambda d: d["hosts"][0].update(docker_url="http://x"), "hosts[0].docker_url: must match"),
    (lambda d: d["hosts"][0].update(gpus_please=1), "hosts[0].gpus_please: unknown field"),
    (lambda d: d["benchmarks"][0].pop("models"), "benchmarks[0].models: is required"),
    (lambda d: d["benchmarks"][0].update(num_gpus=[0]), "benchmarks[0]: device gpu needs num_gpus >= 1"),
    (lambda d: d.update(fleet={"timezone": "Mars/Olympus"}),
     "fleet.timezone: unknown time zone (an IANA name, e.g. Europe/Berlin), got 'Mars/Olympus'"),
    (lambda d: d.update(fleet={"timezone": "Europe"}),  # a folder of zones: was an IsADirectoryError traceback
     "fleet.timezone: unknown time zone (an IANA name, e.g. Europe/Berlin), got 'Europe'"),
    (lambda d: d["benchmarks"][0].update(nodes=[2], variable_update=["parameter_server"], hosts=[{"name": "gpu-01"}]),
     "benchmarks[0].hosts[0]: must be a string"),  # was a TypeError traceback (the multi-node checks)
    (lambda d: d["benchmarks"][0].update(harness="torch_synthetic", nodes=[1, 2], variable_update=None),
     "benchmarks[0].layout: harness torch_synthetic spans hosts with layout launcher, got 'ps_worker'"),
    (lambda d: d["benchmarks"][0].update(variable_update=["replicated", "distributed_replicated"]),
     "benchmarks[0].variable_update[1]: distributed_replicated runs across hosts (nodes > 1); tf_cnn_benchmarks "
     "refuses it in one process"),
    (lambda d: d["benchmarks"][0].update(variable_update=["horovod"]),
     "benchmarks[0].num_gpus[1]: 2 with variable_update horovod: tf_cnn_benchmarks runs horovod with one GPU"),
    (lambda d: d["hosts"].extend([{"name": "gpu-01.lab"}, {"name": "gpu-01_lab"}]),
     "hosts[2].name: 'gpu-01_lab' and 'gpu-01.lab' would share the task group host_gpu-01_lab"),
    (lambda d: d.update(fleet={"schedule": "every night"}),
     "fleet.schedule: not a cron expression of five fields (e.g. '0 2 * * *': minute hour day-of-month month "
     "day-of-week), got 'every night'"),  # the value once
    # croniter reads a sixth field as seconds: this seconds-first 'daily at 02:00' ran every second of a minute
    (lambda d: d.update(fleet={"schedule": "0 0 2 * * *"}), "fleet.schedule: not a cron expression of five fields"),
    (lambda d: d.update(fleet={"schedule": "0 2 31 2 *"}), "fleet.schedule: never fires (no date matches it), got "
     "'0 2 31 2 *'"),  # no 31st of February: the DAG never ran, silently
    (lambda d: d["images"].extend([{**d["images"][0], "name": "Smoke", "bake": {"run": ["true"]}},
                                   {**d["images"][0], "name": "smoke", "bake": {"run": ["true"]}}]),
     "images[2].name: 'smoke' and images[1]'s 'Smoke' would both bake into fleetbench/smoke: rename one"),
    (lambda d: d.update(fleet={"schedule": "@nightly"}), "fleet.schedule: unknown preset (one of @hourly, @daily"),
    # the capacity fit weighs every pair of a profile's readings: 10,000 of them took 53 s and 1.9 GB per profile
    (lambda d: d.update(fleet={"capacity": {"window": 10000}}), "fleet.capacity.window: must be <= 1000, got 10000"),
    (lambda d: d["benchmarks"][0].update(hosts=[]), "benchmarks[0].hosts: must not be empty"),
    (lambda d: d["hosts"][0].update(connection=""), "hosts[0].connection: must match"),
    # docker-py's "Port out of range" reached the image step, which blamed the TLS configuration for it
    (lambda d: d["hosts"][0].update(connection="ssh_01", docker_url="tcp://gpu01:237666"),
     "hosts[0].docker_url: the port must be from 1 to 65535, got 'tcp://gpu01:237666'"),
    (lambda d: d["hosts"][0].update(connection="ssh_01", docker_url="tcp://gpu01:0"),
     "hosts[0].docker_url: the port must be from 1 to 65535"),
    (lambda d: d["hosts"][0].update(connection="ssh gpu01"), "hosts[0].connection: must match"),
    (lambda d: d["benchmarks"][0].update(extra_args=["--x=1; reboot"]), "benchmarks[0].extra_args[0]: must match"),
    # an empty program name started nothing: the telemetry wrapper failed it as exit 127, Docker refused it
    (lambda d: d["images"][0].update(command=["", "bench.py"]),
     "images[0].command: the first item is the program to run, and it is empty: ''"),
    (lambda d: d["benchmarks"][0].update(harness="command", command=[" "], models=None, variable_update=None),
     "benchmarks[0].command: the first item is the program to run, and it is empty: ' '"),
])
def test_each_mistake_names_its_field(mutate, expected):
    data = good()
    mutate(data)
    assert any(e.startswith(expected) for e in errors_of(data)), errors_of(data)


@pytest.mark.parametrize("ref, ok", [
    ("nvcr.io/nvidia/tensorflow:23.03-tf1-py3", True), ("127.0.0.1:5000/fleetbench/cpu-smoke:latest", True),
    ("localhost:5000/team/img", True), ("ubuntu", True), ("a_b__c-d.e/f---g:T_1.x", True),
    ("reg.example/x:1@sha256:" + "0" * 64, True),
    # Docker refuses these ("invalid reference format"): a second tag, an empty path part, a trailing
    # separator, three underscores, an uppercase name, an empty tag
    ("x:1:v2", False), ("a//b", False), ("x.", False), ("x___y", False), ("reg.example/Team/x", False), ("x:", False),
])
def test_image_refs_are_docker_references(ref, ok):
    data = good()
    data["images"][0]["ref"] = ref
    if ok:
        assert parse_config(data).images[0].ref == ref
    else:
        [error] = errors_of(data)
        assert error == ("images[0].ref: must be a Docker image reference: [registry[:port]/]name[:tag][@sha256:<64 "
                         "hex digits>], the name's parts lowercase letters and digits joined by '.', '_', '__' or '-' "
                         f"(e.g. nvcr.io/nvidia/tensorflow:23.03-tf1-py3), got {ref!r}")


def test_all_errors_are_reported_at_once():
    data = good()
    data["benchmarks"][0]["batch_sizes"] = [0, -2]
    data["hosts"][0]["name"] = "bad name"
    errs = errors_of(data)
    assert len(errs) == 3
    assert "fleet.yaml: benchmarks[0].batch_sizes[0]: must be > 0, got 0" in str(ConfigError("fleet.yaml", errs))


def test_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text("hosts:\n  - name: a\n   bad: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors[0].startswith("line 3, column")
    assert "invalid YAML" in info.value.errors[0]


@pytest.mark.parametrize("value, message", [
    ("2024-13-01", "line 2, column 11: invalid YAML: '2024-13-01' is not a valid timestamp: month must be in 1..12 "
                   "(quote it to keep it as text)"),
    ("9" * 5000, "line 2, column 11: invalid YAML: '" + "9" * 40 + "...' is not a valid int: Exceeds the limit"),
])
def test_a_scalar_yaml_cannot_read_as_its_type_is_an_error_at_its_line(tmp_path, value, message):
    """An unquoted impossible date or a number past Python's digit limit raised a ValueError out of the loader: a
    traceback from `config check`, and from the store task for the GPU catalog's `read_on` dates."""
    path = tmp_path / "fleet.yaml"
    path.write_text(f"hosts:\n  - name: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors[0].startswith(message)


def test_a_catalog_with_an_impossible_date_is_not_used_and_the_night_is_stored(tmp_path):
    from fleetbench.metrics import catalog_path, load_catalog_or_none

    text = catalog_path().read_text()
    bad = tmp_path / "catalog.yaml"
    bad.write_text(text.replace("read_on: ", "read_on: 2026-02-30 #", 1))
    assert load_catalog_or_none(bad) is None


def test_missing_file_and_wrong_top_level(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"\(top level\): must be a mapping"):
        load_config(tmp_path / "list.yaml")


def test_digest_is_stable_and_sensitive():
    assert parse_config(good()).digest() == parse_config(good()).digest()
    other = good()
    other["benchmarks"][0]["batch_sizes"] = [32]
    assert parse_config(other).digest() != parse_config(good()).digest()


def test_field_errors_and_references_come_in_one_round():
    """A bad field, a duplicate name, an unknown image and an unknown host: one ConfigError lists all four."""
    data = good()
    data["hosts"].append({"name": "gpu-01", "connection": "ssh_gpu_02", "docker_url": "tcp://gpu-02:2376"})
    data["benchmarks"][0]["batch_sizes"] = [0]
    data["benchmarks"].append({"name": "other", "image": "tf9", "models": ["m"], "batch_sizes": [1],
                               "hosts": ["gpu-77"]})
    assert sorted(errors_of(data)) == sorted([
        "benchmarks[0].batch_sizes[0]: must be > 0, got 0",
        "hosts[1].name: duplicate name 'gpu-01'",
        "benchmarks[1].image: unknown image 'tf9' (known: tf1)",
        "benchmarks[1].hosts[0]: unknown host 'gpu-77' (known: gpu-01)",
    ])



def test_a_case_key_two_benchmarks_would_plan_names_both_at_parse_time(tmp_path):
    """Keys join names and axis values with dots, which names may hold: the clash is a config error naming both
    benchmarks, not a ValueError of every run's plan task."""
    from fleetbench.plan import expand_cases

    data = good()
    data["benchmarks"] = [
        {"name": "cnn", "image": "tf1", "models": ["resnet50.v1"], "batch_sizes": [64, 128]},
        {"name": "cnn.resnet50", "image": "tf1", "models": ["v1", "v2"], "batch_sizes": [64, 128]},
        {"name": "cnn.resnet50.v2", "image": "tf1", "models": ["bs64"], "batch_sizes": [8], "num_gpus": [2]}]
    data["hosts"][0]["address"] = "10.0.0.1"
    assert errors_of(data) == [
        "benchmarks[1].name: case key 'cnn.resnet50.v1.bs64.g1.parameter_server' (and 1 more) is also planned by "
        "benchmarks[0] ('cnn'): rename one"]
    data["benchmarks"][0]["nodes"] = [2]  # cnn's keys are now ...n2.<hosts>: no clash with one-host keys
    expand_cases(parse_config(data))
    data["benchmarks"][1]["nodes"] = [1, 2]
    assert errors_of(data) == [
        "benchmarks[1].name: case key 'cnn.resnet50.v1.bs64.g1.parameter_server.n2.<host set>' (and 1 more) is also "
        "planned by benchmarks[0] ('cnn'): rename one"]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([*FLEETBENCH, "config", "check", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "is also planned by benchmarks[0]" in proc.stderr

def test_config_check_warns_on_a_plain_tcp_engine(tmp_path):
    data = good()
    data["hosts"].append({"name": "gpu-02", "connection": "ssh_gpu_02", "docker_url": "tcp://gpu-02:2376",
                          "docker_tls_conn_id": "fleet_tls"})
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([*FLEETBENCH, "config", "check", str(path)], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok")
    assert proc.stderr.count("warning") == 1
    assert f"{path}: warning: hosts[0].docker_url: tcp://gpu-01:2376 without docker_tls_conn_id" in proc.stderr


def test_cli_config_check(tmp_path):
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(good()))
    proc = subprocess.run([*FLEETBENCH, "config", "check", str(ok)], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok")

    data = good()
    data["benchmarks"][0]["batch_sizes"] = [32, -1]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    proc = subprocess.run([*FLEETBENCH, "config", "check", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{bad}: benchmarks[0].batch_sizes[1]: must be > 0, got -1"
    assert "Traceback" not in proc.stderr

    proc = subprocess.run([*FLEETBENCH, "config", "check", str(tmp_path / "missing.yaml")], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "cannot read file" in proc.stderr and "Traceback" not in proc.stderr


# -- a host's facts come from one machine -----------------------------------------------------
@pytest.mark.parametrize("host", [
    {"name": "gpu-01", "connection": "local", "docker_url": "tcp://gpu-01:2376"},
    # connection defaults to local
    {"name": "gpu-01", "docker_url": "tcp://gpu-01:2376", "docker_tls_conn_id": "fleet_tls"},
    {"name": "gpu-01", "connection": "local", "docker_url": "ssh://bench@gpu-01"},
])
def test_local_connection_refuses_a_remote_engine(host):
    data = good()
    data["hosts"] = [host]
    [error] = errors_of(data)
    assert error.startswith("hosts[0].docker_url: ") and error.endswith(f"got {host['docker_url']!r}")
    assert "SSH connection" in error and "unix://" in error


@pytest.mark.parametrize("host", [
    {"name": "gpu-01", "connection": "ssh_gpu_01", "docker_url": "tcp://gpu-01:2376",
     "docker_tls_conn_id": "fleet_tls"},
    {"name": "gpu-01", "connection": "ssh_gpu_01", "docker_url": "ssh://bench@gpu-01"},
    {"name": "gpu-01", "connection": "local", "docker_url": "unix:///run/user/1000/docker.sock"},
])
def test_one_machine_per_host_is_accepted(host):
    data = good()
    data["hosts"] = [host]
    assert parse_config(data).hosts[0].docker_url == host["docker_url"]


# -- the file itself: encoding and duplicate keys ---------------------------------------------
def test_non_utf8_file_names_the_byte_offset(tmp_path):
    path = tmp_path / "fleet.yaml"
    blob = yaml.safe_dump(good()).encode()
    offset = blob.index(b"gpu-01")
    path.write_bytes(blob[:offset] + b"\xe9" + blob[offset:])  # latin-1 "é"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    assert info.value.errors == [f"byte {offset}: not UTF-8 text (invalid continuation byte 0xe9); "
                                 "save the file as UTF-8"]

    proc = subprocess.run([*FLEETBENCH, "config", "check", str(path)], capture_output=True, text=True)
    assert (proc.returncode == 2 and f"{path}: byte {offset}: not UTF-8" in proc.stderr
            and "Traceback" not in proc.stderr)


def test_duplicate_keys_are_refused_at_any_depth_all_at_once(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "hosts:\n"                                   # 1
        "  - name: gpu-01\n"                         # 2
        "images:\n"                                  # 3
        "  - name: tf1\n"                            # 4
        "    ref: nvcr.io/nvidia/tensorflow:23.03-tf1-py3\n"
        "    command: [python, tf_cnn_benchmarks.py]\n"
        "    ref: nvcr.io/nvidia/tensorflow:24.01-tf2-py3\n"  # 7
        "benchmarks:\n"                              # 8
        "  - {name: cnn, image: tf1, models: [resnet50], batch_sizes: [32],\n"
        "     container: {shm_size: 1g, shm_size: 2g}}\n"    # 10
        "hosts:\n"                                   # 11
        "  - name: gpu-02\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [
        "line 7, column 5: duplicate key 'ref' (first on line 5); YAML would keep only the last",
        "line 10, column 32: duplicate key 'shm_size' (first on line 10); YAML would keep only the last",
        "line 11, column 1: duplicate key 'hosts' (first on line 1); YAML would keep only the last",
    ]
    assert str(info.value).startswith(f"{path}: line 7, column 5: duplicate key 'ref'")


MERGED_HOSTS = """\
hosts:
  - &gpu {name: gpu-01, connection: ssh_gpu_01, docker_url: 'tcp://gpu-01:2376', price_per_gpu_hour: 1.0}
  - {<<: *gpu, name: gpu-02, connection: ssh_gpu_02, %s}
images:
  - {name: tf1, ref: 'nvcr.io/nvidia/tensorflow:23.03-tf1-py3', command: [python]}
benchmarks:
  - {name: cnn, image: tf1, models: [resnet50], batch_sizes: [32]}
"""


def test_merge_keys_may_be_overridden_but_not_repeated(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(MERGED_HOSTS % "price_per_gpu_hour: 2.0")
    assert [(h.name, h.connection, h.price_per_gpu_hour) for h in load_config(path).hosts] == [
        ("gpu-01", "ssh_gpu_01", 1.0), ("gpu-02", "ssh_gpu_02", 2.0)]

    path.write_text(MERGED_HOSTS % "price_per_gpu_hour: 2.0, price_per_gpu_hour: 3.0")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [
        "line 3, column 79: duplicate key 'price_per_gpu_hour' (first on line 3); YAML would keep only the last"]


def test_the_loader_stays_on_libyaml():
    from fleetbench import config

    if hasattr(yaml, "CSafeLoader"):
        assert issubclass(config._YAML_LOADER, yaml.CSafeLoader)


# -- values that would fail later: bounds, finiteness, repeats --------------------------------
NAN, INF = float("nan"), float("inf")


def container(**fields):
    return lambda d: d["benchmarks"][0].update(container=fields)


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["benchmarks"][0].update(batch_sizes=[32, 64, 32]),
     "benchmarks[0].batch_sizes: must not repeat a value: 32 at [0] and [2]"),
    (lambda d: d["benchmarks"][0].update(models=["resnet50", "vgg16", "resnet50", "vgg16"]),
     "benchmarks[0].models: must not repeat a value: 'resnet50' at [0] and [2], 'vgg16' at [1] and [3]"),
    (lambda d: d["benchmarks"][0].update(num_gpus=[1, 1]),
     "benchmarks[0].num_gpus: must not repeat a value: 1 at [0] and [1]"),
    (lambda d: d["benchmarks"][0].update(variable_update=["replicated", "replicated"]),
     "benchmarks[0].variable_update: must not repeat a value: 'replicated' at [0] and [1]"),
    (lambda d: d["benchmarks"][0].update(batch_sizes=[32, 100000]),
     "benchmarks[0].batch_sizes[1]: must be <= 65536, got 100000"),
    (lambda d: d["benchmarks"][0].update(timeout_s=10**14),
     "benchmarks[0].timeout_s: must be <= 604800, got 100000000000000"),
    (lambda d: d["benchmarks"][0].update(timeout_s=INF), "benchmarks[0].timeout_s: must be a finite number, got inf"),
    (lambda d: d["benchmarks"][0].update(telemetry_period_s=NAN),
     "benchmarks[0].telemetry_period_s: must be a finite number, got nan"),
    (container(cpus=INF), "benchmarks[0].container.cpus: must be a finite number, got inf"),
    (container(cpus=4096), "benchmarks[0].container.cpus: must be <= 1024.0, got 4096"),
    (container(cpus=NAN), "benchmarks[0].container.cpus: must be a finite number, got nan"),
    (lambda d: d["hosts"][0].update(min_free_gb=INF), "hosts[0].min_free_gb: must be a finite number, got inf"),
    (lambda d: d["hosts"][0].update(min_free_gb=2e6), "hosts[0].min_free_gb: must be <= 1000000.0, got 2000000.0"),
    (lambda d: d["hosts"][0].update(price_per_gpu_hour=NAN),
     "hosts[0].price_per_gpu_hour: must be a finite number, got nan"),
    (lambda d: d["hosts"][0].update(price_per_gpu_hour=-INF),
     "hosts[0].price_per_gpu_hour: must be a finite number, got -inf"),
    (lambda d: d["images"][0].update(min_free_gb=NAN), "images[0].min_free_gb: must be a finite number, got nan"),
    (lambda d: d["images"][0].update(bake={"run": ["true"], "timeout_s": 10**9}),
     "images[0].bake.timeout_s: must be <= 604800"),
    (lambda d: d.update(fleet={"carbon_g_per_kwh": INF}), "fleet.carbon_g_per_kwh: must be a finite number, got inf"),
    (lambda d: d.update(fleet={"regressions": {"z_threshold": NAN}}),
     "fleet.regressions.z_threshold: must be a finite number, got nan"),
])
def test_values_that_would_fail_later_are_refused(mutate, expected):
    data = good()
    mutate(data)
    assert any(e.startswith(expected) for e in errors_of(data)), errors_of(data)


def test_limits_are_inclusive():
    data = good()
    data["hosts"][0]["min_free_gb"] = 1e6
    data["benchmarks"][0].update(batch_sizes=[65536], timeout_s=7 * 24 * 3600, container={"cpus": 1024})
    assert parse_config(data).benchmarks[0].timeout_s == 604800


def test_bounds_and_repeats_come_all_at_once_from_the_file(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "hosts:\n"
        "  - {name: gpu-01, min_free_gb: .inf}\n"
        "  - {name: gpu-02, price_per_gpu_hour: .nan}\n"
        "images:\n"
        "  - {name: tf1, ref: 'nvcr.io/nvidia/tensorflow:23.03-tf1-py3', command: [python]}\n"
        "benchmarks:\n"
        "  - {name: cnn, image: tf1, models: [resnet50, resnet50], batch_sizes: [64, 64], num_gpus: [2, 2],\n"
        "     timeout_s: 100000000000000, container: {cpus: .inf}}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == [
        "hosts[0].min_free_gb: must be a finite number, got inf",
        "hosts[1].price_per_gpu_hour: must be a finite number, got nan",
        "benchmarks[0].models: must not repeat a value: 'resnet50' at [0] and [1]",
        "benchmarks[0].batch_sizes: must not repeat a value: 64 at [0] and [1]",
        "benchmarks[0].num_gpus: must not repeat a value: 2 at [0] and [1]",
        "benchmarks[0].timeout_s: must be <= 604800, got 100000000000000",
        "benchmarks[0].container.cpus: must be a finite number, got inf",
    ]


def test_mistyped_names_are_field_errors_not_a_crash():
    """The reference checks read the raw data: a name that is a list or a mapping is the field checks' to name."""
    data = good()
    data["hosts"].append({"name": ["gpu-02"], "connection": "ssh_gpu_02", "docker_url": "tcp://gpu-02:2376"})
    data["images"][0]["name"] = {"a": 1}
    data["benchmarks"][0]["image"] = ["tf1"]
    errs = errors_of(data)
    assert {"hosts[1].name: must be a string", "images[0].name: must be a string",
            "benchmarks[0].image: must be a string"} <= set(errs)


def _fleet_file(path: Path, host: str) -> Path:
    data = good()
    data["hosts"][0]["name"] = host
    path.write_text(yaml.safe_dump(data))
    return path


def test_load_config_once_reads_an_unchanged_file_once(tmp_path, monkeypatch):
    """The two DAG files share one read of the config per process (a DagBag of dags/ parses both)."""
    from fleetbench import config

    path = _fleet_file(tmp_path / "fleet.yaml", "gpu-01")
    reads = []
    monkeypatch.setattr(config, "load_config", lambda p: reads.append(p) or load_config(p))
    first = config.load_config_once(path)
    assert config.load_config_once(str(path)) is first and len(reads) == 1
    assert [h.name for h in first.hosts] == ["gpu-01"]


def test_load_config_once_rereads_a_changed_file(tmp_path):
    """An edit is picked up on the next parse: also one that keeps the size and the modification time, and a file
    swapped in by a rename."""
    from fleetbench.config import load_config_once

    path = _fleet_file(tmp_path / "fleet.yaml", "gpu-01")
    assert [h.name for h in load_config_once(path).hosts] == ["gpu-01"]
    before = path.stat()
    _fleet_file(path, "gpu-02")  # same length
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    assert [h.name for h in load_config_once(path).hosts] == ["gpu-02"]
    os.replace(_fleet_file(tmp_path / "new.yaml", "gpu-03"), path)
    assert [h.name for h in load_config_once(path).hosts] == ["gpu-03"]
    other = _fleet_file(tmp_path / "other.yaml", "gpu-04")  # another path: its own config
    assert [h.name for h in load_config_once(other).hosts] == ["gpu-04"]
    assert [h.name for h in load_config_once(path).hosts] == ["gpu-03"]


def test_load_config_once_reports_a_bad_file_on_every_parse(tmp_path):
    from fleetbench.config import load_config_once

    path = tmp_path / "fleet.yaml"
    path.write_text("hosts: [\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match="invalid YAML"):
            load_config_once(path)
    with pytest.raises(ConfigError, match="cannot read file"):
        load_config_once(tmp_path / "missing.yaml")
    _fleet_file(path, "gpu-05")  # fixed: read
    assert [h.name for h in load_config_once(path).hosts] == ["gpu-05"]


def test_a_gpu_benchmarks_container_keeps_ngcs_flags_it_does_not_set():
    """`container: {environment: ...}` on a GPU benchmark (e.g. TF_FORCE_GPU_ALLOW_GROWTH) keeps NGC's shm_size and
    ulimits (it dropped them: Docker's 64 MB /dev/shm for NCCL), also after the run's parameters are applied."""
    from fleetbench.params import apply_params

    data = good()
    data["benchmarks"][0]["container"] = {"environment": {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}}
    for cfg in (parse_config(data), apply_params(parse_config(data), {"num_batches": 5})):
        c = cfg.benchmarks[0].container_settings()
        assert (c.shm_size, c.ulimits) == ("1g", {"memlock": -1, "stack": 67108864})
        assert c.environment == {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    data["benchmarks"][0]["container"] = {"shm_size": "8g", "ulimits": {"nofile": 65536}}
    c = parse_config(data).benchmarks[0].container_settings()
    assert (c.shm_size, c.ulimits) == ("8g", {"nofile": 65536})  # what it sets is its own



def test_hosts_whose_names_differ_only_in_a_trailing_separator_are_refused():
    """`gpu01` and `gpu01-` wrote one artifacts folder (a host judged on the other's probe outputs, each case's files
    replacing the other's) and one pool."""
    from test_harnesses import config_errors

    data = {"hosts": [{"name": "gpu01"}, {"name": "gpu01-"}, {"name": "gpu01_"}],
            "images": [{"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "command": ["python3", "x.py"]}],
            "benchmarks": [{"name": "b", "image": "tf1", "models": ["m"], "batch_sizes": [8]}]}
    assert config_errors(data) == [
        "hosts[1].name: 'gpu01-' and 'gpu01' would share the artifacts folder and pool 'gpu01' (a name's trailing '_', "
        "'.' and '-' are dropped there): rename one",
        "hosts[2].name: 'gpu01_' and 'gpu01' would share the artifacts folder and pool 'gpu01' (a name's trailing '_', "
        "'.' and '-' are dropped there): rename one"]


def test_num_batches_beyond_the_warehouses_column_is_refused():
    from test_harnesses import config_errors

    data = {"hosts": [{"name": "a"}],
            "images": [{"name": "tf1", "ref": "127.0.0.1:5000/tf:1", "command": ["python3", "x.py"]}],
            "benchmarks": [{"name": "b", "image": "tf1", "models": ["m"], "batch_sizes": [8],
                            "num_batches": 3_000_000_000}]}
    [error] = config_errors(data)
    assert error.startswith("benchmarks[0].num_batches: ") and "1000000" in error


def test_a_gpu_catalog_price_of_inf_is_refused(tmp_path):
    from fleetbench.metrics import catalog_path, load_catalog

    bad = tmp_path / "catalog.yaml"
    text = catalog_path().read_text()
    start = text.index("price_per_gpu_hour_usd: ") + len("price_per_gpu_hour_usd: ")
    bad.write_text(text[:start] + ".inf" + text[text.index("\n", start):])
    with pytest.raises(ConfigError, match=r"gpus\[0\]\.price_per_gpu_hour_usd"):
        load_catalog(bad)


def test_a_cli_argument_that_is_not_utf8_is_named_not_a_traceback(capsys):
    from fleetbench.cli import main

    assert main(["results", "--run-id", "\udcff"]) == 2  # how Python passes the byte 0xff of argv
    assert capsys.readouterr().err == "fleetbench results: run-id '\\xff': not UTF-8 text\n"
