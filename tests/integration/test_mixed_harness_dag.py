"""fleet_benchmark with benchmarks of several harnesses in one fleet config (tf_cnn_benchmarks, torch_synthetic,
command): real containers, rows and metric samples for each."""

from __future__ import annotations

import json

import pytest

from fleet_configs import containers_of, run_fleet_dag, smoke_config, write_config

TORCH_IMAGE = "fleetbench/torch-cpu:latest"  # include/images/torch-cpu/build.sh (make images), local only

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

# The command benchmark: a real measured loop printing a JSON metric line and a regex-readable one.
COMMAND_PROGRAM = (
    "import json, time\n"
    "t0 = time.perf_counter(); n = sum(len(str(i)) for i in range(200000)); dt = time.perf_counter() - t0\n"
    "print(json.dumps({'metric': 'chars_per_sec', 'value': n / dt, 'unit': 'items/s', 'better': 'higher'}))\n"
    "print(f'latency {dt * 1000:.3f} ms')\n"
    # the container's settings arrive as written in the fleet config (not as Jinja templates): else exit 5
    "import os, sys\n"
    "seen = (os.environ['BENCH_SCRIPT'], os.environ['BENCH_COUNT'], os.environ['BENCH_BRACES'],"
    " open('/opt/bench/run.sh').read())\n"
    "sys.exit(0 if seen == ('/opt/bench/run.sh', 'n=${#items[@]}', '{{ 6 * 7 }}', 'echo run\\n') else 5)\n"
)
# Values Jinja would have taken for its own: a template file name (DockerOperator's `.sh`), an unclosed comment
# (`{#`), an expression.
COMMAND_CONTAINER = {"environment": {"BENCH_SCRIPT": "/opt/bench/run.sh", "BENCH_COUNT": "n=${#items[@]}",
                                     "BENCH_BRACES": "{{ 6 * 7 }}"}}


@pytest.fixture(scope="session")
def torch_image(docker_api) -> str:
    try:
        docker_api.inspect_image(TORCH_IMAGE)
    except Exception as exc:
        pytest.fail(f"{TORCH_IMAGE} is not built ({exc}); run `make images`, which builds it")
    return TORCH_IMAGE


def mixed_config(image: str, script: str) -> dict:
    config = smoke_config(image, models=("trivial",), batch_sizes=(8,), num_batches=5)
    config["images"].append({"name": "torch-cpu", "ref": TORCH_IMAGE, "pull_policy": "never",
                             "command": ["python3", "/opt/fleetbench/torch_synthetic.py"]})
    config["benchmarks"].append({  # a real training loop: resnet18 on 32x32 synthetic images, eager and channels_last
        "name": "pt", "image": "torch-cpu", "harness": "torch_synthetic", "device": "cpu", "num_gpus": [0],
        "models": ["resnet18"], "batch_sizes": [4], "channels_last": [False, True], "num_batches": 3,
        "num_warmup_batches": 1, "timeout_s": 300, "extra_args": ["--image_size=32", "--num_classes=10"],
    })
    config["benchmarks"].append({
        "name": "own", "image": "cpu-smoke", "harness": "command", "device": "cpu", "num_gpus": [0],
        "timeout_s": 120, "command": ["python3", "-c", COMMAND_PROGRAM],
        "metrics": {"patterns": [{"metric": "latency", "regex": r"^latency ([0-9.]+) ms$", "unit": "ms"}]},
        "container": {**COMMAND_CONTAINER, "mounts": [{"source": script, "target": "/opt/bench/run.sh"}]},
    })
    config["benchmarks"].append({  # prints nothing it could measure: a no_result row, the night goes on
        "name": "silent", "image": "cpu-smoke", "harness": "command", "device": "cpu", "num_gpus": [0],
        "timeout_s": 120, "command": ["python3", "-c", "print('done')"],
    })
    return config


def test_a_fleet_of_several_harnesses_stores_rows_and_metrics_for_each(airflow_db, data_dir, smoke_image, torch_image,
                                                                        docker_api, tmp_path, monkeypatch):
    script = tmp_path / "run.sh"
    script.write_text("echo run\n")
    config = write_config(tmp_path / "fleet.yaml", mixed_config(smoke_image, str(script)))
    dag_run = run_fleet_dag(monkeypatch, config)
    assert dag_run.state == "success"

    from sqlalchemy import select

    from fleetbench.warehouse import fetch_results, get_engine
    from fleetbench.warehouse.schema import result_metrics

    engine = get_engine()
    rows = {r["case_key"]: r for r in fetch_results(engine, run_id=dag_run.run_id)}
    assert set(rows) == {"smoke.trivial.bs8.g0.parameter_server", "own.g0", "silent.g0",
                         "pt.resnet18.bs4.g0.fp32.nchw.eager", "pt.resnet18.bs4.g0.fp32.nhwc.eager"}
    for key in ("pt.resnet18.bs4.g0.fp32.nchw.eager", "pt.resnet18.bs4.g0.fp32.nhwc.eager"):
        pt = rows[key]
        assert (pt["status"], pt["harness"], pt["metric"], pt["unit"], pt["better"]) == (
            "ok", "torch_synthetic", "images_per_sec", "images/s", "higher"), pt
        assert pt["value"] == pt["images_per_sec"] > 0 and pt["step_count"] == 3 and pt["model"] == "resnet18"
        command = json.loads(pt["command"])
        assert "--device=cpu" in command and "--batch_size=4" in command
        assert ("--channels_last=1" in command) == key.endswith("nhwc.eager")
    cnn, own, silent = rows["smoke.trivial.bs8.g0.parameter_server"], rows["own.g0"], rows["silent.g0"]
    assert (cnn["status"], cnn["harness"], cnn["metric"], cnn["unit"], cnn["better"]) == (
        "ok", "tf_cnn_benchmarks", "images_per_sec", "images/s", "higher")
    assert cnn["value"] == cnn["images_per_sec"] > 0
    assert (own["status"], own["harness"], own["metric"], own["unit"], own["better"]) == (
        "ok", "command", "chars_per_sec", "items/s", "higher")
    assert own["value"] > 0 and own["images_per_sec"] is None and own["model"] is None
    assert json.loads(own["command"])[:2] == ["python3", "-c"]
    assert (silent["status"], silent["failure_class"], silent["harness"]) == ("failed", "no_result", "command")

    with engine.connect() as conn:
        samples = {(r.case_key, r.metric): (r.value, r.unit, r.better) for r in conn.execute(
            select(result_metrics).where(result_metrics.c.run_id == dag_run.run_id))}
    assert samples[("smoke.trivial.bs8.g0.parameter_server", "images_per_sec")] == (
        cnn["images_per_sec"], "images/s", "higher")
    assert samples[("own.g0", "chars_per_sec")] == (own["value"], "items/s", "higher")
    latency = samples[("own.g0", "latency")]
    assert latency[0] > 0 and latency[1:] == ("ms", "lower")
    assert not [k for k in samples if k[0] == "silent.g0"]
    pt = "pt.resnet18.bs4.g0.fp32.nchw.eager"
    assert samples[(pt, "images_per_sec")] == (rows[pt]["value"], "images/s", "higher")
    assert samples[(pt, "step_time_median")][1:] == ("ms", "lower")
    assert samples[(pt, "final_loss")][1:] == ("1", "lower")
    with engine.connect() as conn:
        from fleetbench.warehouse.schema import steps

        pt_steps = conn.execute(select(steps.c.step, steps.c.images_per_sec).where(
            steps.c.run_id == dag_run.run_id, steps.c.case_key == pt).order_by(steps.c.step)).all()
    assert [s for s, _ in pt_steps] == [1, 2, 3] and all(v > 0 for _, v in pt_steps)
    assert containers_of(docker_api, dag_run.run_id) == []
