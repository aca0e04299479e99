"""Fleet config validation: good files load, every mistake names its field, `config check` never tracebacks."""

from __future__ import annotations

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


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["benchmarks"][0]["batch_sizes"].__setitem__(1, -1), "benchmarks[0].batch_sizes[1]: must be > 0, got -1"),
    (lambda d: d["benchmarks"][0]["models"].append("resnet50; rm -rf /"),
     "benchmarks[0].models[2]: must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$, got 'resnet50; rm -rf /'"),
    (lambda d: d["benchmarks"][0].update(image="tf2"), "benchmarks[0].image: unknown image 'tf2' (known: tf1)"),
    (lambda d: d["benchmarks"][0].update(hosts=["gpu-02"]), "benchmarks[0].hosts[0]: unknown host 'gpu-02' (known: gpu-01)"),
    (lambda d: d["hosts"].append({"name": "gpu-01"}), "hosts[1].name: duplicate name 'gpu-01'"),
    (lambda d: d["images"][0].update(pull_policy="sometimes"),
     "images[0].pull_policy: must be one of 'always', 'if-missing' or 'never', got 'sometimes'"),
    (lambda d: d["images"][0].update(cuda="twelve"), "images[0].cuda: must match ^\\d+\\.\\d+$, got 'twelve'"),
    (lambda d: d["hosts"][0].update(docker_url="http://x"), "hosts[0].docker_url: must match"),
    (lambda d: d["hosts"][0].update(gpus_please=1), "hosts[0].gpus_please: unknown field"),
    (lambda d: d["benchmarks"][0].pop("models"), "benchmarks[0].models: is required"),
    (lambda d: d["benchmarks"][0].update(num_gpus=[0]), "benchmarks[0]: device gpu needs num_gpus >= 1"),
    (lambda d: d.update(fleet={"timezone": "Mars/Olympus"}), "fleet.timezone: unknown time zone 'Mars/Olympus'"),
    (lambda d: d.update(fleet={"schedule": "every night"}), "fleet.schedule: not a valid cron expression: 'every night'"),
    (lambda d: d["benchmarks"][0].update(extra_args=["--x=1; reboot"]), "benchmarks[0].extra_args[0]: must match"),
])
def test_each_mistake_names_its_field(mutate, expected):
    data = good()
    mutate(data)
    assert any(e.startswith(expected) for e in errors_of(data)), errors_of(data)


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

    proc = subprocess.run([*FLEETBENCH, "config", "check", str(tmp_path / "missing.yaml")], capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot read file" in proc.stderr and "Traceback" not in proc.stderr
