"""Helpers for tests that run fleet_benchmark: fleet configs (plain dicts -> YAML files) and dag.test()."""

from __future__ import annotations

from pathlib import Path

import yaml

SMOKE_COMMAND = ["python3", "/opt/fleetbench/tf_cnn_benchmarks.py"]


def smoke_config(image_ref: str, hosts: list[dict] | None = None, models=("trivial", "lenet"), batch_sizes=(8, 16),
                 num_batches: int = 10, timeout_s: int = 120, **bench) -> dict:
    return {
        "fleet": {"name": "test", "timezone": "UTC", "schedule": "0 2 * * *"},
        "hosts": hosts or [{"name": "localhost", "connection": "local"}],
        "images": [{"name": "cpu-smoke", "ref": image_ref, "pull_policy": "always", "command": SMOKE_COMMAND}],
        "benchmarks": [{
            "name": "smoke", "image": "cpu-smoke", "device": "cpu", "models": list(models),
            "batch_sizes": list(batch_sizes), "num_gpus": [0], "num_batches": num_batches,
            "num_warmup_batches": 1, "timeout_s": timeout_s, **bench,
        }],
    }


# The upstream tf_cnn_benchmarks as the runbook bakes it: cloned into the image by fleetbench's bake step.
REAL_TF_COMMAND = ["python3", "/opt/benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py"]


def real_tf_config(image_ref: str, git_url: str, hosts: list[dict] | None = None, models=("trivial",),
                   batch_sizes=(2,), num_batches: int = 10, timeout_s: int = 600, branch: str = "master",
                   **bench) -> dict:
    """A fleet running the real upstream tf_cnn_benchmarks on TensorFlow CPU (image `tf-real`, benchmark `tf`)."""
    return {
        "fleet": {"name": "test", "timezone": "UTC", "schedule": "0 2 * * *"},
        "hosts": hosts or [{"name": "localhost", "connection": "local"}],
        "images": [{"name": "tf-real", "ref": image_ref, "pull_policy": "never", "command": REAL_TF_COMMAND,
                    "bake": {"git": {"url": git_url, "branch": branch, "dest": "/opt/benchmarks"}}}],
        "benchmarks": [{
            "name": "tf", "image": "tf-real", "device": "cpu", "models": list(models),
            "batch_sizes": list(batch_sizes), "num_gpus": [0], "num_batches": num_batches,
            "num_warmup_batches": 2, "timeout_s": timeout_s, **bench,
        }],
    }


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_fleet_dag(monkeypatch, config_path: Path, run_conf: dict | None = None):
    """Parse dags/ with `config_path` as the fleet config and run fleet_benchmark once with dag.test()."""
    monkeypatch.setenv("FLEETBENCH_CONFIG", str(config_path))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[1] / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag("fleet_benchmark").test(run_conf=run_conf)


def containers_of(docker_api, run_id: str) -> list[dict]:
    """Containers (running or not) that carry the run's label."""
    return docker_api.containers(all=True, filters={"label": f"org.fleetbench.run_id={run_id}"})
