"""The real upstream tf_cnn_benchmarks (tensorflow/benchmarks master) on TensorFlow 2.15.1 CPU, baked into the
image by fleetbench's own bake step (`bake.git` + `docker commit`) and run through fleet_benchmark: real rows.

Needs fleetbench/tf-cpu:latest (`make images`) and the benchmarks' git repository (FLEETBENCH_TF_BENCHMARKS_GIT or
../shared/vendor); without the repository it skips, saying why."""

from __future__ import annotations

import json

import pytest

from fleet_configs import REAL_TF_COMMAND, containers_of, real_tf_config, run_fleet_dag, write_config

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

# Sane CPU bounds (images/sec, batch 2): upstream on this kind of VM measured resnet50 2.3 and trivial ~600 at
# batch 32 (tests/fixtures/real-tf215). Wide enough for a loaded machine, narrow enough to catch a unit mix-up.
BOUNDS = {"resnet50": (0.05, 200.0), "trivial": (1.0, 100_000.0)}


def test_real_tf_cnn_benchmarks_baked_from_git_stores_real_rows(airflow_db, data_dir, tf_image, tf_benchmarks_git,
                                                                docker_api, tmp_path, monkeypatch):
    config = write_config(tmp_path / "fleet.yaml", real_tf_config(
        tf_image, tf_benchmarks_git, models=("trivial", "resnet50"), batch_sizes=(2,), num_batches=10))
    dag_run = run_fleet_dag(monkeypatch, config)
    assert dag_run.state == "success"

    from fleetbench.warehouse import fetch_results, get_engine

    rows = {r["model"]: r for r in fetch_results(get_engine(), run_id=dag_run.run_id)}
    assert set(rows) == {"trivial", "resnet50"}
    base = docker_api.inspect_image(tf_image)
    # The bake step cloned the upstream repository (its master commit) and committed it into an image.
    source = f"git:{tf_benchmarks_git}#master"
    baked = docker_api.images(filters={"label": [f"org.fleetbench.harness.source={source}"]})
    assert baked, f"no image baked from {source}"
    labels = baked[0]["Labels"]
    assert len(labels["org.fleetbench.harness.revision"]) == 40  # the commit master resolved to
    assert labels["org.fleetbench.bake.base_ref"] == tf_image
    for model, row in rows.items():
        low, high = BOUNDS[model]
        assert row["status"] == "ok", (model, row["failure_class"], row["failure_detail"])
        assert row["harness"] == "tf_cnn_benchmarks" and row["metric"] == "images_per_sec"
        assert low < row["images_per_sec"] < high, (model, row["images_per_sec"])
        assert row["value"] == row["images_per_sec"] and row["step_count"] == 2  # upstream prints steps 1 and 10
        # A local-only base has no registry digest: the row names it by its image id.
        assert (row["image_ref"], row["image_digest"]) == (tf_image, base["Id"])
        command = json.loads(row["command"])
        assert command[:len(REAL_TF_COMMAND)] == REAL_TF_COMMAND
        for flag in (f"--model={model}", "--batch_size=2", "--num_batches=10", "--device=cpu",
                     "--data_format=NHWC"):
            assert flag in command, (flag, command)
        log = open(row["log_path"], encoding="utf-8", errors="replace").read()
        # The upstream program's own banner and result line, not the smoke stand-in's.
        assert "TensorFlow:  2.15" in log and f"Model:       {model}" in log and "total images/sec:" in log
    assert containers_of(docker_api, dag_run.run_id) == []
