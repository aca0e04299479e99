"""Fleet configs written by tests (plain dicts -> YAML files)."""

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


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
