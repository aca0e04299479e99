"""Derived metrics against hand-worked numbers, from real Lambda logs where the numbers come from a log.

Real logs: tests/fixtures/real-logs and tests/fixtures/logs (see SOURCES.md in each)
(tfcnn_resnet50_2gpu_lambda-2080ti-tf115.log, see SOURCES.md there). The arithmetic behind every
expected number is written next to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fleetbench.metrics import (
    ESTIMATED,
    MEASURED,
    NONE,
    MetricSettings,
    carbon_g,
    cost_per_million_images_usd,
    cost_usd,
    derive,
    energy_j,
    estimated_power_w,
    gpu_hour_price,
    images_per_joule,
    kwh,
    load_catalog,
    match_speedup,
    mig_share,
    per_unit,
    precision_of,
    speedup_efficiency,
    step_stats,
    time_for_batches_s,
    time_to_accuracy_s,
    variant_of,
    work_unit,
)
from fleetbench.parsing import parse_log

ROOT = Path(__file__).resolve().parents[2]
REAL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "real-logs"  # tests/fixtures/real-logs/SOURCES.md
OUR_LOGS = ROOT / "tests" / "fixtures" / "logs"
RESNET_1GPU_2080TI = REAL_LOGS / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log"
RESNET_2GPU_2080TI = OUR_LOGS / "tfcnn_resnet50_2gpu_lambda-2080ti-tf115.log"
RESNET_8GPU_V100 = REAL_LOGS / "tfcnn_resnet50_8gpu_lambda-v100-fp16.log"


def parsed(path: Path):
    return parse_log(path.read_text(encoding="utf-8"), "tf_cnn_benchmarks")


def step_values(path: Path) -> list[float]:
    return [s.images_per_sec for s in parsed(path).steps]


# -- 1. training time ---------------------------------------------------------------------------
def test_time_for_batches_from_real_logs():
    one, two = parsed(RESNET_1GPU_2080TI), parsed(RESNET_2GPU_2080TI)
    # 1 GPU: 100 batches x 64 images / 292.85 images/s = 6400 / 292.85 = 21.8542 s
    assert time_for_batches_s(100, one.batch_size_global, one.total_images_per_sec) == pytest.approx(21.8542, abs=1e-4)
    # 2 GPUs: 100 x 128 / 530.29 = 12800 / 530.29 = 24.1377 s
    assert time_for_batches_s(100, two.batch_size_global, two.total_images_per_sec) == pytest.approx(24.1377, abs=1e-4)
    # The log's own clock agrees: step 1 at unix 1593716179, step 100 at 1593716200 (21 s, whole seconds).
    assert 21 <= time_for_batches_s(100, 64, 292.85) <= 22


@pytest.mark.parametrize("args", [(None, 64, 292.85), (100, None, 292.85), (100, 64, None), (100, 64, 0.0),
                                  (0, 64, 1.0)])
def test_time_for_batches_needs_every_input(args):
    assert time_for_batches_s(*args) is None


def test_time_to_accuracy():
    # Accuracy reported at 30 s (0.61), 60 s (0.74), 90 s (0.76): the target 0.75 is first reached at 90 s,
    # 0.70 at 60 s; 0.80 never.
    points = [(30.0, 0.61), (60.0, 0.74), (90.0, 0.76)]
    assert time_to_accuracy_s(points, 0.75) == 90.0
    assert time_to_accuracy_s(points, 0.70) == 60.0
    assert time_to_accuracy_s(points, 0.80) is None
    assert time_to_accuracy_s(points, None) is None
    # tf_cnn_benchmarks' eval fixture reports one final "Accuracy @ 1 = 0.7500": reached at the case's wall time.
    final = parse_log((OUR_LOGS / "tf_cnn_eval_accuracy_real_data.log").read_text(), "tf_cnn_benchmarks").accuracy_top1
    assert final == 0.75
    assert time_to_accuracy_s([(42.0, final)], 0.75) == 42.0
    assert time_to_accuracy_s([(42.0, None)], 0.75) is None


# -- 2. throughput ------------------------------------------------------------------------------
def test_step_stats_of_the_1gpu_2080ti_log():
    values = step_values(RESNET_1GPU_2080TI)
    assert values == [295.2, 294.8, 294.3, 294.0, 293.9, 293.8, 293.8, 293.4, 293.4, 293.3, 293.1]
    stats = step_stats(values)
    # sorted: 293.1 293.3 293.4 293.4 293.8 [293.8] 293.9 294.0 294.3 294.8 295.2 -> median (6th of 11) 293.8
    # sum 3233.0 -> mean 3233.0 / 11 = 293.90909
    # squared deviations from the mean sum to 4.189091 -> s^2 = 4.189091 / 10, s = 0.647232
    # cv = 0.647232 / 293.90909 = 0.0022021; spread = 295.2 - 293.1 = 2.1
    assert stats.n == 11
    assert stats.median == pytest.approx(293.8)
    assert stats.mean == pytest.approx(293.90909, abs=1e-5)
    assert stats.stdev == pytest.approx(0.647232, abs=1e-6)
    assert stats.cv == pytest.approx(0.0022021, abs=1e-7)
    assert stats.spread == pytest.approx(2.1)


def test_step_stats_of_the_2gpu_2080ti_log():
    values = step_values(RESNET_2GPU_2080TI)
    assert values == [541.4, 539.9, 539.9, 539.1, 538.9, 538.5, 537.7, 535.8, 533.6, 532.0, 530.6]
    stats = step_stats(values)
    # sorted: 530.6 532.0 533.6 535.8 537.7 [538.5] 538.9 539.1 539.9 539.9 541.4 -> median 538.5
    # sum 5907.4 -> mean 537.03636; squared deviations sum to 125.885455 -> s = sqrt(12.5885455) = 3.548034
    # cv = 3.548034 / 537.03636 = 0.0066067; spread = 541.4 - 530.6 = 10.8
    assert stats.median == pytest.approx(538.5)
    assert stats.stdev == pytest.approx(3.548034, abs=1e-6)
    assert stats.cv == pytest.approx(0.0066067, abs=1e-7)
    assert stats.spread == pytest.approx(10.8)


def test_step_stats_drops_warm_up_samples():
    # Without the first sample (a warm-up 50.0): 98, 100, 102 -> median 100, mean 100,
    # s = sqrt((4 + 0 + 4) / 2) = 2, cv = 0.02, spread 4.
    stats = step_stats([50.0, 98.0, 100.0, 102.0], warmup_steps=1)
    assert (stats.n, stats.median, stats.mean, stats.stdev, stats.spread) == (3, 100.0, 100.0, 2.0, 4.0)
    assert stats.cv == pytest.approx(0.02)
    single = step_stats([7.0])
    assert (single.n, single.median, single.stdev, single.cv, single.spread) == (1, 7.0, 0.0, 0.0, 0.0)
    assert step_stats([]) is None
    assert step_stats([5.0], warmup_steps=1) is None


# -- 3. speedup efficiency ----------------------------------------------------------------------
def test_speedup_efficiency_formula():
    # 4 GPUs at 1000 images/s against 1 GPU at 300: 1000 / (4 x 300) = 0.8333
    assert speedup_efficiency(1000.0, 4, 300.0) == pytest.approx(0.833333, abs=1e-6)
    assert speedup_efficiency(300.0, 1, 300.0) == 1.0
    assert speedup_efficiency(None, 4, 300.0) is None
    assert speedup_efficiency(1000.0, 0, 300.0) is None
    assert speedup_efficiency(1000.0, 4, 0.0) is None


def lambda_row(path: Path, host: str, **over) -> dict:
    """A result row as fleetbench.airflow.pipeline.collect builds it, with the numbers a real log gives."""
    log = parsed(path)
    gpus = log.num_gpus
    row = {
        "dag_id": "fleet_benchmark", "run_id": "r1", "host": host,
        "case_key": f"cnn.{log.model}.bs{log.batch_size_per_device}.g{gpus}.{log.variable_update}",
        "benchmark": "cnn", "model": log.model, "batch_size_per_device": log.batch_size_per_device,
        "batch_size_global": log.batch_size_global, "num_gpus": gpus, "variable_update": log.variable_update,
        "device": "gpu", "num_batches": 100, "image_name": "tf1", "status": log.status,
        "images_per_sec": log.total_images_per_sec, "step_count": log.step_count, "duration_s": 60.0,
        "command": ["python", "tf_cnn_benchmarks.py", f"--model={log.model}", f"--num_gpus={gpus}"],
        "gpu_model": None, "energy_source": "none", "energy_j": None, "mean_power_w": None, "mean_gpu_util_pct": None,
    }
    row.update(over)
    return row


def step_rows_of(path: Path, row: dict) -> list[dict]:
    return [{"dag_id": row["dag_id"], "run_id": row["run_id"], "host": row["host"], "case_key": row["case_key"],
             "step": s.step, "images_per_sec": s.images_per_sec} for s in parsed(path).steps]


def test_speedup_is_matched_across_the_runs_rows_from_real_logs():
    one = lambda_row(RESNET_1GPU_2080TI, "lambda-2080ti", precision="fp32")
    two = lambda_row(RESNET_2GPU_2080TI, "lambda-2080ti", precision="fp32")
    # The V100 8-GPU log: batch 384 per device and fp16 (its Lambda folder says so), on another host;
    # no 1-GPU run of that host, model, batch and precision: no efficiency.
    eight = lambda_row(RESNET_8GPU_V100, "lambda-v100", precision="fp16")
    matched = match_speedup([one, two, eight])
    # 530.29 / (2 x 292.85) = 530.29 / 585.70 = 0.905395
    assert matched[("lambda-2080ti", two["case_key"])] == (pytest.approx(0.905395, abs=1e-6), one["case_key"])
    assert matched[("lambda-2080ti", one["case_key"])] == (1.0, one["case_key"])
    assert ("lambda-v100", eight["case_key"]) not in matched


def test_speedup_needs_the_same_host_batch_and_precision():
    one = lambda_row(RESNET_1GPU_2080TI, "lambda-2080ti", precision="fp32")
    two = lambda_row(RESNET_2GPU_2080TI, "lambda-2080ti", precision="fp32")
    for field, value in (("host", "other-host"), ("precision", "fp16"), ("batch_size_per_device", 128),
                         ("run_id", "r2"), ("variable_update", "parameter_server")):
        assert ("lambda-2080ti" if field != "host" else "other-host", two["case_key"]) not in match_speedup(
            [one, {**two, field: value}]), field
    failed_baseline = {**one, "status": "failed", "images_per_sec": None}
    assert ("lambda-2080ti", two["case_key"]) not in match_speedup([failed_baseline, two])


@pytest.mark.parametrize("command, expected", [
    (["python", "tf_cnn_benchmarks.py", "--model=resnet50"], "fp32"),
    (["python", "tf_cnn_benchmarks.py", "--use_fp16"], "fp16"),
    (["python", "tf_cnn_benchmarks.py", "--use_fp16=True"], "fp16"),
    (["python", "tf_cnn_benchmarks.py", "--use_fp16=false"], "fp32"),
    (["python", "tf_cnn_benchmarks.py", "--auto_mixed_precision=True"], "fp16"),
    ('["python", "x.py", "--use_fp16=1"]', "fp16"),  # as the warehouse stores it (JSON text)
    (["python3", "torch_synthetic.py", "--model=resnet50", "--precision=bf16"], "bf16"),  # was fp32
    (["python3", "torch_synthetic.py", "--precision=fp16", "--channels_last=1"], "fp16"),
    (["python3", "torch_synthetic.py", "--precision=fp32"], "fp32"),
    # a flag given twice is read as the programs read it, the last one (an image's --use_fp16, a benchmark's
    # extra_args turning it off): it was fp16, and the fp32 case joined the fp16 baselines and profiles
    (["python", "tf_cnn_benchmarks.py", "--use_fp16", "--model=resnet50", "--use_fp16=false"], "fp32"),
    (["python", "tf_cnn_benchmarks.py", "--use_fp16=true", "--nouse_fp16"], "fp32"),
    (["python", "tf_cnn_benchmarks.py", "--nouse_fp16", "--use_fp16"], "fp16"),
    (["python", "tf_cnn_benchmarks.py", "--use_fp16=false", "--auto_mixed_precision"], "fp16"),
    (["python3", "torch_synthetic.py", "--precision=fp16", "--precision=bf16"], "bf16"),
    (None, None),
])
def test_precision_of_the_command_line(command, expected):
    assert precision_of(command) == expected



@pytest.mark.parametrize("command, expected", [
    (["python", "/opt/fleetbench/torch_synthetic.py", "--precision=bf16", "--channels_last=1", "--compile=0"],
     "nhwc.eager"),
    ('["python", "t.py", "--channels_last=0", "--compile=1"]', "nchw.compiled"),  # JSON text, as stored
    (["torchrun", "--nproc_per_node=2", "t.py", "--channels_last=0", "--compile=0", "--compile=1"], "nchw.compiled"),
    (["python", "tf_cnn_benchmarks.py", "--model=resnet50", "--num_gpus=8"], None),
    (["python", "t.py", "--compile=1"], None),  # not both of torch_synthetic's flags
    (None, None),
])
def test_variant_of_the_command_line(command, expected):
    assert variant_of(command) == expected


def test_speedup_of_torch_synthetic_is_within_its_eager_or_compiled_variant():
    """The GPU example's pt-train (num_gpus [1, 8], compile [false, true]) as plan and collect build its rows: each
    8-GPU case scales at 90 % of its own 1-GPU case; compiled runs 1.5x as fast as eager."""
    from fleetbench.config import load_config
    from fleetbench.measure import result_row
    from fleetbench.plan import expand_cases
    from fleetbench.run_model import RunInfo

    cases = [c for c in expand_cases(load_config(ROOT / "include" / "config" / "fleet.gpu-example.yaml"))
             if c.benchmark == "pt-train" and c.model == "resnet50" and c.batch_size_per_device == 128]
    cases = [c for c in cases if c.host == cases[0].host]
    assert sorted(c.case_key.rsplit(".", 1)[1] for c in cases) == ["compiled", "compiled", "eager", "eager"]
    rows = []
    for c in cases:
        one = 1000.0 * (1.5 if c.case_key.endswith(".compiled") else 1.0)
        rows.append(result_row(RunInfo(dag_id="d", run_id="r"), c, None, None, {
            "status": "ok", "images_per_sec": one if c.num_gpus == 1 else 0.9 * c.num_gpus * one,
            "duration_s": 60.0, "command": c.command}))
    for r in derive(rows, [], None, None):
        # was: the compiled 1-GPU row was every case's baseline (eager 8 GPUs: 7200 / (8 x 1500) = 0.6)
        assert r["speedup_efficiency"] == pytest.approx(1.0 if r["num_gpus"] == 1 else 0.9), r["case_key"]
        base = r["speedup_baseline_case_key"]
        assert ".g1." in base and base.rsplit(".", 1)[1] == r["case_key"].rsplit(".", 1)[1], r["case_key"]

# -- 4. cost ------------------------------------------------------------------------------------
def test_cost_formulas():
    # fleet.gpu-example.yaml's gpu-a100-01 costs 2.9 USD per GPU-hour: 8 GPUs for 90 s
    # = 2.9 x 8 x 90 / 3600 = 0.58 USD
    assert cost_usd(2.9, 8, 90.0) == pytest.approx(0.58)
    # at the V100 log's 4676.54 images/s a million images cost 2.9 x 8 / (3600 x 4676.54) x 1e6
    # = 23.2 / 16835544 x 1e6 = 1.378037 USD
    assert cost_per_million_images_usd(2.9, 8, 4676.54) == pytest.approx(1.378037, abs=1e-6)
    assert cost_usd(None, 8, 90.0) is None and cost_usd(2.9, 0, 90.0) is None and cost_usd(2.9, 8, None) is None
    assert cost_per_million_images_usd(2.9, 8, 0.0) is None


def test_host_price_wins_over_the_catalog():
    assert gpu_hour_price(2.9, 1.99) == (2.9, "host")
    assert gpu_hour_price(None, 1.99) == (1.99, "catalog")
    assert gpu_hour_price(0.0, 1.99) == (0.0, "host")  # an owned host can cost nothing per hour
    assert gpu_hour_price(None, None) == (None, None)


# -- 5. power and energy ------------------------------------------------------------------------
def test_energy_formulas():
    # 8 V100 SXM3 at the catalog's 350 W each, fully busy: 8 x 350 x 1.0 = 2800 W
    assert estimated_power_w(350, 8) == 2800.0
    # 60 % utilisation: 8 x 350 x 0.6 = 1680 W; the model clamps u to [0, 1]
    assert estimated_power_w(350, 8, 0.6) == pytest.approx(1680.0)
    assert estimated_power_w(350, 8, 1.7) == 2800.0
    assert estimated_power_w(350, 0) is None and estimated_power_w(None, 8) is None
    # 2800 W for 90 s = 252000 J = 252000 / 3.6e6 kWh = 0.07 kWh
    assert energy_j(2800.0, 90.0) == 252000.0
    assert kwh(252000.0) == pytest.approx(0.07)
    # 4676.54 images/s at 2800 W = 4676.54 / 2800 = 1.670193 images per joule
    assert images_per_joule(4676.54, 2800.0) == pytest.approx(1.670193, abs=1e-6)
    # 0.07 kWh on a 400 gCO2e/kWh grid = 28 g
    assert carbon_g(0.07, 400.0) == pytest.approx(28.0)
    assert carbon_g(0.07, None) is None and kwh(None) is None and images_per_joule(100.0, 0.0) is None


# -- derive: every metric on a run's rows -------------------------------------------------------
def run_rows() -> tuple[list[dict], list[dict]]:
    one = lambda_row(RESNET_1GPU_2080TI, "lambda-2080ti", gpu_model="GeForce RTX 2080 Ti", duration_s=60.0,
                     energy_source="measured", energy_j=12000.0, mean_power_w=200.0, mean_gpu_util_pct=97.0)
    two = lambda_row(RESNET_2GPU_2080TI, "lambda-2080ti", gpu_model="GeForce RTX 2080 Ti", duration_s=75.0)
    v100 = lambda_row(RESNET_8GPU_V100, "lambda-v100", gpu_model="Tesla V100-SXM3-32GB", duration_s=90.0,
                      mean_gpu_util_pct=60.0, command=["python", "tf_cnn_benchmarks.py", "--use_fp16=True"])
    cpu = {**lambda_row(RESNET_1GPU_2080TI, "localhost", duration_s=5.0),
           "case_key": "smoke.trivial.bs8.g0.parameter_server", "num_gpus": 0, "device": "cpu", "model": "trivial"}
    skipped = {**lambda_row(RESNET_1GPU_2080TI, "ghost", gpu_model=None, duration_s=None), "status": "skipped",
               "images_per_sec": None, "failure_class": "host_unfit", "command": None}
    steps = step_rows_of(RESNET_1GPU_2080TI, one) + step_rows_of(RESNET_2GPU_2080TI, two)
    return [one, two, v100, cpu, skipped], steps


def test_derive_fills_every_metric():
    rows, steps = run_rows()
    before = json.dumps(rows, sort_keys=True)
    settings = MetricSettings(host_prices={"lambda-2080ti": 0.35, "lambda-v100": None}, carbon_g_per_kwh=400.0)
    one, two, v100, cpu, skipped = derive(rows, steps, load_catalog(), settings)
    assert json.dumps(rows, sort_keys=True) == before  # the input rows are not changed

    # 1-GPU 2080 Ti: measured energy stays; 12000 J = 0.0033333 kWh; 292.85 images/s / 200 W = 1.46425 images/J;
    # carbon 0.0033333 kWh x 400 = 1.33333 g; host price 0.35 x 1 GPU x 60 s / 3600 = 0.0058333 USD
    assert (one["energy_source"], one["energy_j"], one["mean_power_w"]) == (MEASURED, 12000.0, 200.0)
    assert one["energy_kwh"] == pytest.approx(0.0033333, abs=1e-7)
    assert one["images_per_joule"] == pytest.approx(1.46425)
    assert one["carbon_g"] == pytest.approx(1.33333, abs=1e-5) and one["carbon_g_per_kwh"] == 400.0
    assert (one["price_per_gpu_hour"], one["price_source"]) == (0.35, "host")
    assert one["cost_usd"] == pytest.approx(0.0058333, abs=1e-7)
    assert one["time_for_batches_s"] == pytest.approx(21.8542, abs=1e-4)
    assert (one["step_median_images_per_sec"] == pytest.approx(293.8)
            and one["step_cv"] == pytest.approx(0.0022021, abs=1e-7))
    assert one["step_spread_images_per_sec"] == pytest.approx(2.1)
    assert ((one["speedup_efficiency"], one["precision"], one["gpu_catalog_name"])
            == (1.0, "fp32", "GeForce RTX 2080 Ti"))

    # 2-GPU 2080 Ti: not measured -> estimated from the catalog's 260 W: 2 x 260 x 1.0 = 520 W,
    # x 75 s = 39000 J = 0.0108333 kWh; 530.29 / 520 = 1.019788 images/J; carbon 0.0108333 x 400 = 4.33333 g
    assert (two["energy_source"], two["mean_power_w"], two["energy_j"]) == (ESTIMATED, 520.0, 39000.0)
    assert two["energy_kwh"] == pytest.approx(0.0108333, abs=1e-7)
    assert two["images_per_joule"] == pytest.approx(1.019788, abs=1e-6)
    assert two["carbon_g"] == pytest.approx(4.33333, abs=1e-5)
    # speedup 530.29 / (2 x 292.85) = 0.905395 against the 1-GPU case
    assert two["speedup_efficiency"] == pytest.approx(0.905395, abs=1e-6)
    assert two["speedup_baseline_case_key"] == one["case_key"]
    # cost 0.35 x 2 x 75 / 3600 = 0.0145833 USD; a million images: 0.7 / (3600 x 530.29) x 1e6 = 0.366676 USD
    assert two["cost_usd"] == pytest.approx(0.0145833, abs=1e-7)
    assert two["cost_per_million_images_usd"] == pytest.approx(0.366676, abs=1e-6)
    assert two["step_median_images_per_sec"] == pytest.approx(538.5)

    # 8x V100 SXM3, fp16, no host price and no catalog price: no cost; energy estimated with the
    # measured 60 % utilisation: 8 x 350 x 0.6 = 1680 W x 90 s = 151200 J = 0.042 kWh; no steps given
    assert v100["precision"] == "fp16" and v100["gpu_catalog_name"] == "V100 SXM3 32GB"
    assert (v100["price_per_gpu_hour"], v100["cost_usd"], v100["cost_per_million_images_usd"]) == (None, None, None)
    assert (v100["energy_source"], v100["mean_power_w"]) == (ESTIMATED, pytest.approx(1680.0))
    assert v100["energy_j"] == pytest.approx(151200.0) and v100["energy_kwh"] == pytest.approx(0.042)
    assert v100["speedup_efficiency"] is None and v100["step_median_images_per_sec"] is None

    # A CPU case: no GPU, so no GPU-hour cost and no energy; a skipped case has nothing to derive.
    assert ((cpu["energy_source"], cpu["energy_j"], cpu["cost_usd"], cpu["speedup_efficiency"])
            == (NONE, None, None, None))
    assert cpu["time_for_batches_s"] == pytest.approx(21.8542, abs=1e-4)
    assert (skipped["energy_source"], skipped["time_for_batches_s"], skipped["precision"], skipped["carbon_g"]) == (
        NONE, None, None, None)


def test_derive_takes_the_price_from_the_catalog_when_the_host_has_none():
    row = lambda_row(RESNET_8GPU_V100, "a100-host", gpu_model="NVIDIA A100-SXM4-40GB", duration_s=90.0,
                     images_per_sec=7796.86)
    (out,) = derive([row], [], load_catalog(), MetricSettings())
    # catalog: A100 SXM4 40GB at 1.99 USD/GPU-h -> 1.99 x 8 x 90 / 3600 = 0.398 USD;
    # a million images at 7796.86 images/s: 1.99 x 8 / (3600 x 7796.86) x 1e6 = 0.567180 USD
    assert (out["price_per_gpu_hour"], out["price_source"]) == (1.99, "catalog")
    assert out["cost_usd"] == pytest.approx(0.398)
    assert out["cost_per_million_images_usd"] == pytest.approx(0.567180, abs=1e-6)
    # 8 x 400 W (catalog TDP) x 90 s = 288000 J = 0.08 kWh; no carbon factor configured
    assert out["energy_kwh"] == pytest.approx(0.08) and out["carbon_g"] is None


def test_a_multi_node_case_draws_power_and_pays_on_every_host_of_its_set():
    one = lambda_row(RESNET_8GPU_V100, "h1", gpu_model="NVIDIA A100-SXM4-80GB", duration_s=100.0,
                     images_per_sec=1000.0)
    two = {**one, "case_key": one["case_key"] + ".n2.h1+h2", "nodes": 2, "images_per_sec": 1900.0}
    one_out, two_out = derive([one, two], [], load_catalog(), MetricSettings(host_prices={"h1": 2.0}))
    # A100 SXM4 80GB: 400 W TDP. One host: 8 x 400 = 3200 W; the set of two: 6400 W (it was 3200 W, so the
    # set's 1900 images/s looked 1.9x as efficient per joule while its cost was counted for both hosts).
    assert (one_out["mean_power_w"], two_out["mean_power_w"]) == (3200.0, 6400.0)
    assert two_out["energy_j"] == 6400.0 * 100.0 and two_out["energy_source"] == ESTIMATED
    assert two_out["images_per_joule"] == pytest.approx(1900.0 / 6400.0)
    assert two_out["cost_usd"] == pytest.approx(2 * one_out["cost_usd"])


def test_speedup_of_mig_cases_is_within_one_profile():
    base = lambda_row(RESNET_1GPU_2080TI, "h100-host", precision="fp32")
    small = {**base, "case_key": "mig.g1.mig-1g.10gb", "mig_profile": "1g.10gb", "num_gpus": 1, "images_per_sec": 100.0}
    big1 = {**base, "case_key": "mig.g1.mig-3g.40gb", "mig_profile": "3g.40gb", "num_gpus": 1, "images_per_sec": 300.0}
    big2 = {**base, "case_key": "mig.g2.mig-3g.40gb", "mig_profile": "3g.40gb", "num_gpus": 2, "images_per_sec": 540.0}
    matched = match_speedup([small, big1, big2])
    assert matched[("h100-host", small["case_key"])] == (1.0, small["case_key"])  # was 0.333 against 3g x 1
    assert matched[("h100-host", big1["case_key"])] == (1.0, big1["case_key"])
    assert matched[("h100-host", big2["case_key"])] == (pytest.approx(0.9), big1["case_key"])



@pytest.mark.parametrize("profile, gpu_model, share", [
    ("1g.10gb", "NVIDIA A100-SXM4-80GB", 1 / 7), ("3g.40gb", "NVIDIA A100-SXM4-80GB", 3 / 7),
    ("7g.80gb", "NVIDIA A100-SXM4-80GB", 1.0), ("1g.10gb+me", "NVIDIA H100 80GB HBM3", 1 / 7),
    ("4g.71gb", "NVIDIA H200", 4 / 7), ("1c.3g.20gb", "A100-SXM4-40GB", 1 / 7),  # a compute instance's 1 slice
    ("1g.6gb", "NVIDIA A30", 1 / 4), ("2g.48gb", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 2 / 4),
    ("1g.24gb", "NVIDIA RTX PRO 5000 Blackwell", 1 / 2),
    (None, "NVIDIA A100-SXM4-80GB", 1.0), ("odd", "NVIDIA A100-SXM4-80GB", 1.0),
])
def test_mig_share_is_the_profiles_compute_slices_of_its_gpus(profile, gpu_model, share):
    assert mig_share(profile, gpu_model) == pytest.approx(share)


def test_a_mig_case_is_priced_and_estimated_as_its_share_of_the_gpu():
    """2 x 1g.10gb of one A100 SXM4 80GB (catalog: 400 W, $2.79 per GPU-hour) for an hour, no measured energy (NVML
    has no utilisation in MIG mode): 2/7 of the GPU. It was 2 GPU-hours and 800 W, twice the board's TDP."""
    row = lambda_row(RESNET_1GPU_2080TI, "a100", case_key="cmd.g2.mig-1g.10gb", num_gpus=2, mig_profile="1g.10gb",
                     gpu_model="NVIDIA A100-SXM4-80GB", duration_s=3600.0, images_per_sec=200.0)
    whole = {**row, "case_key": "cnn.g2", "mig_profile": None}
    mig, gpus = derive([row, whole], [], load_catalog(), None)
    assert (mig["price_per_gpu_hour"], mig["price_source"]) == (2.79, "catalog")
    assert mig["cost_usd"] == pytest.approx(2.79 * 2 / 7) and gpus["cost_usd"] == pytest.approx(2.79 * 2)
    assert mig["cost_per_million_images_usd"] == pytest.approx(2.79 * 2 / 7 / (3600 * 200.0) * 1e6)
    assert mig["energy_source"] == ESTIMATED and mig["mean_power_w"] == pytest.approx(400.0 * 2 / 7)
    assert mig["energy_kwh"] == pytest.approx(0.4 * 2 / 7) and gpus["mean_power_w"] == 800.0
    # the host's own price per GPU-hour is shared the same way
    (priced,) = derive([row], [], load_catalog(), MetricSettings(host_prices={"a100": 3.5}))
    assert (priced["cost_usd"], priced["price_source"]) == (pytest.approx(3.5 * 2 / 7), "host")


@pytest.mark.parametrize("boards, share", [(1, 2 / 7), (2, 1 / 7)])
def test_a_mig_cases_measured_energy_is_its_share_of_the_boards(boards, share):
    """NVML reads whole boards: 2 x 1g.10gb on one A100 board measured 90 W for an hour, the other five slices'
    draw included. The case is given 2/7 of that board (on two boards, 1/7 of each), as its cost and its estimate
    are; a whole-GPU case keeps what it measured."""
    telemetry = json.dumps({"nvml": True, "gpus": [{"index": i} for i in range(boards)]})
    row = lambda_row(RESNET_1GPU_2080TI, "a100", case_key="cmd.g2.mig-1g.10gb", num_gpus=2, mig_profile="1g.10gb",
                     gpu_model="NVIDIA A100-SXM4-80GB", duration_s=3600.0, images_per_sec=200.0,
                     energy_source="measured", energy_j=90.0 * 3600 * boards, mean_power_w=90.0 * boards,
                     telemetry_json=telemetry)
    whole = {**row, "case_key": "cnn.g2", "mig_profile": None}
    mig, gpus = derive([row, whole], [], load_catalog(), None)
    assert mig["energy_source"] == "measured" and mig["energy_j"] == pytest.approx(90.0 * 3600 * 2 / 7)
    assert mig["mean_power_w"] == pytest.approx(90.0 * 2 / 7) and mig["energy_kwh"] == pytest.approx(0.09 * 2 / 7)
    assert mig["images_per_joule"] == pytest.approx(200.0 / (90.0 * 2 / 7))
    assert gpus["energy_j"] == 90.0 * 3600 * boards and gpus["mean_power_w"] == 90.0 * boards
    assert share * boards == pytest.approx(2 / 7)


@pytest.mark.parametrize("gpus, start_error", [(8, "no_gpu_runtime"), (0, "container_config")])
def test_a_case_that_never_started_has_no_energy(tmp_path, gpus, start_error):
    """A container the engine refused to start: the operator records 0 s of wall time. It drew no power; it was
    estimated at 8 x 700 W (0 J), flagged as if it had run."""
    from fleetbench.measure import measure

    log = tmp_path / "case.log"
    log.write_text("fleetbench: container could not start: 500 Server Error: unknown or invalid runtime name\n")
    outcome = {"start_error_class": start_error, "error": "unknown or invalid runtime name: nvidia",
               "exit_code": None, "started_at": "2026-01-01T00:00:00+00:00",
               "finished_at": "2026-01-01T00:00:00+00:00", "duration_s": 0.0, "log_path": str(log),
               "command": ["python", "tf_cnn_benchmarks.py", f"--num_gpus={gpus}"]}
    fields, _ = measure({"command": outcome["command"], "harness": "tf_cnn_benchmarks", "harness_settings": {}},
                        outcome)
    row = {"host": "h", "case_key": "k", "num_gpus": gpus, "gpu_model": "NVIDIA H100 80GB HBM3" if gpus else None,
           "nodes": 1, "cpu_threads": 16, **fields, "mean_cpu_util_pct": 0.0}  # every other input of a CPU estimate
    (r,) = derive([row], [], load_catalog(), MetricSettings(host_prices={"h": 3.0}, host_cpu_tdp_w={"h": 150.0}))
    assert (r["status"], r["duration_s"]) == ("failed", 0.0)
    assert (r["energy_source"], r["energy_j"], r["energy_kwh"], r["mean_power_w"], r["images_per_joule"]) == (
        NONE, None, None, None, None)

def test_derive_without_a_catalog_estimates_nothing():
    rows, steps = run_rows()
    two = derive(rows, steps, None, None)[1]
    assert ((two["energy_source"], two["energy_j"], two["gpu_catalog_name"], two["price_source"])
            == (NONE, None, None, None))
    assert two["speedup_efficiency"] == pytest.approx(0.905395, abs=1e-6)  # needs no catalog


# -- settings from the run's plan ---------------------------------------------------------------
def gpu_fleet(carbon: float | None) -> dict:
    return {
        "fleet": {"name": "lab", "carbon_g_per_kwh": carbon},
        "hosts": [{"name": "a100", "price_per_gpu_hour": 2.9}, {"name": "rtx"}],
        "images": [{"name": "tf1", "ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3", "cuda": "12.1",
                    "command": ["python", "/workspace/tf_cnn_benchmarks.py"]}],
        "benchmarks": [{"name": "cnn", "image": "tf1", "models": ["resnet50"], "batch_sizes": [64], "num_gpus": [1, 2],
                        "variable_update": ["replicated"]}],
    }


def test_settings_from_the_plan(tmp_path):
    from fleetbench.airflow.pipeline import make_plan
    from fleetbench.config import load_config
    from fleetbench.run_model import RunPlan

    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(gpu_fleet(436.0)))
    plan = RunPlan.load(make_plan({"dag_id": "fleet_benchmark", "run_id": "r1"}, str(path)))

    def settings_from_plan(plan):
        return MetricSettings.from_plan(RunPlan.load(plan))

    settings = settings_from_plan(plan)
    assert settings.host_prices == {"a100": 2.9, "rtx": None}
    assert settings.carbon_g_per_kwh == 436.0
    assert MetricSettings.from_config(load_config(path)) == MetricSettings(
        host_prices={"a100": 2.9, "rtx": None}, carbon_g_per_kwh=436.0, host_hour_prices={"a100": None, "rtx": None},
        host_cpu_tdp_w={"a100": None, "rtx": None})
    # The plan carries its settings: editing or removing the file afterwards does not change this run's figures.
    path.write_text(yaml.safe_dump(gpu_fleet(100.0)))
    assert settings_from_plan(plan).carbon_g_per_kwh == 436.0
    path.unlink()
    assert settings_from_plan(plan) == MetricSettings(
        host_prices={"a100": 2.9, "rtx": None}, carbon_g_per_kwh=436.0, host_hour_prices={"a100": None, "rtx": None},
        host_cpu_tdp_w={"a100": None, "rtx": None})


def test_carbon_intensity_is_validated():
    from fleetbench.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as err:
        parse_config(gpu_fleet(-5.0))
    assert "fleet.carbon_g_per_kwh: must be >= 0.0, got -5.0" in str(err.value)
    assert parse_config(gpu_fleet(None)).fleet.carbon_g_per_kwh is None


# -- the pipeline stores derived metrics ----------------------------------------------------------
def _collected_2080ti(tmp_path) -> tuple[dict, dict]:
    """The plan of two cases (1 and 2 GPUs) on a 2080 Ti host, and collect()'s rows of the two real logs."""
    from fleetbench.airflow.pipeline import collect, make_plan
    from fleetbench.hosts import Gpu, HostFacts

    fleet = gpu_fleet(400.0)
    fleet["hosts"] = [{"name": "lambda-2080ti", "price_per_gpu_hour": 0.35}]
    # The logs' host ran driver 440.64 (CUDA 10.2), which cannot run a CUDA 12.1 image (its cases would be skipped
    # as driver_too_old): the image's CUDA is left out, as for the image those logs came from.
    del fleet["images"][0]["cuda"]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    plan = make_plan({"dag_id": "fleet_benchmark", "run_id": "manual__1", "logical_date": "2026-12-02T02:00:00+00:00"},
                     str(path))
    facts = HostFacts(driver_version="440.64", cuda_driver_version="10.2",
                      gpus=[Gpu(i, "GeForce RTX 2080 Ti", None, 11019) for i in range(2)])
    validations = [{"host": "lambda-2080ti", "verdict": "ready", "reasons": "", "checks": [], "facts": facts.to_dict()}]
    prepared = [{"host": "lambda-2080ti", "images": {"tf1": {"ref": "nvcr.io/nvidia/tensorflow:23.03-tf1-py3",
                                                            "digest": "sha256:" + "b" * 64, "pinned_ref": "x"}}}]
    logs = {1: RESNET_1GPU_2080TI, 2: RESNET_2GPU_2080TI}
    durations = {1: 60.0, 2: 75.0}
    outcomes = [{"host": c["host"], "case_key": c["case_key"], "exit_code": 0, "log_path": str(logs[c["num_gpus"]]),
                 "duration_s": durations[c["num_gpus"]], "started_at": "2026-12-02T02:01:00+00:00",
                 "finished_at": "2026-12-02T02:02:15+00:00", "command": c["command"]} for c in plan["cases"]]
    return plan, collect(plan, validations, prepared, outcomes)


def test_store_writes_derived_metrics_for_every_row(data_dir, tmp_path):
    """collect() -> store() on the two real 2080 Ti logs: the warehouse rows carry the derived metrics."""
    from fleetbench.airflow.pipeline import store
    from fleetbench.warehouse import fetch_results, get_engine

    plan, collected = _collected_2080ti(tmp_path)
    assert store(plan, collected)["ok"] == 2

    rows = {r["num_gpus"]: r for r in fetch_results(get_engine(), run_id="manual__1")}
    one, two = rows[1], rows[2]
    assert ((one["precision"], one["gpu_catalog_name"], one["speedup_efficiency"])
            == ("fp32", "GeForce RTX 2080 Ti", 1.0))
    # 530.29 / (2 x 292.85) = 0.905395, matched to the 1-GPU case of the same run
    assert two["speedup_efficiency"] == pytest.approx(0.905395, abs=1e-6)
    assert two["speedup_baseline_case_key"] == one["case_key"] == "cnn.resnet50.bs64.g1.replicated"
    # steps: median 538.5, cv 0.0066067 (see test_step_stats_of_the_2gpu_2080ti_log)
    assert (two["step_median_images_per_sec"] == pytest.approx(538.5)
            and two["step_cv"] == pytest.approx(0.0066067, abs=1e-7))
    # the host's price: 0.35 x 2 x 75 / 3600 = 0.0145833 USD
    assert (two["price_source"], two["cost_usd"]) == ("host", pytest.approx(0.0145833, abs=1e-7))
    # no telemetry in Lambda's logs: estimated, 2 x 260 W x 75 s = 39000 J; 0.0108333 kWh x 400 g/kWh = 4.33333 g
    assert (two["energy_source"], two["energy_j"]) == ("estimated", 39000.0)
    assert two["carbon_g"] == pytest.approx(4.33333, abs=1e-5) and two["carbon_g_per_kwh"] == 400.0
    assert one["time_for_batches_s"] == pytest.approx(21.8542, abs=1e-4)


def test_store_counts_a_row_stored_as_store_error_failed(data_dir, tmp_path):
    """A measured row with a value beyond its column is stored failed / store_error: the store task's summary and
    the run's row count it failed, as the results and the rollups do, not ok as it was collected."""
    from sqlalchemy import text

    from fleetbench.airflow.pipeline import store
    from fleetbench.warehouse import fetch_results, get_engine

    plan, collected = _collected_2080ti(tmp_path)
    collected["rows"][0]["num_batches"] = 2**40
    summary = store(plan, collected)
    assert {k: summary[k] for k in ("total", "ok", "failed", "skipped")} == {"total": 2, "ok": 1, "failed": 1,
                                                                            "skipped": 0}
    engine = get_engine()
    assert sorted((r["status"], r["failure_class"]) for r in fetch_results(engine, run_id="manual__1")) == [
        ("failed", "store_error"), ("ok", None)]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT cases_total, cases_ok, cases_failed, cases_skipped FROM runs")).all() == [
            (2, 1, 1, 0)]
    engine.dispose()


def test_work_unit_of_rate_metrics_only():
    assert work_unit("images/s", "higher") == ("images", 1e6)
    assert work_unit("samples / sec", "higher") == ("samples", 1e6)
    assert work_unit("GB/s", "higher") == ("GB", 1.0)
    assert work_unit("tok/s", "higher") == ("tok", 1e6)
    for unit, better in (("ms", "lower"), ("GB/s", "lower"), ("1", "higher"), (None, "higher"), ("/s", "higher")):
        assert work_unit(unit, better) is None


def test_cost_and_energy_per_unit_of_the_primary_metric():
    # 2,000 images/s for 600 s at $3.60 an hour ($0.60) and 400 W (240,000 J): 1.2 M images
    row = {"metric": "images_per_sec", "value": 2000.0, "unit": "images/s", "better": "higher", "duration_s": 600.0,
           "cost_usd": 0.60, "energy_j": 240_000.0, "energy_source": MEASURED}
    got = per_unit(row)
    assert got["per"] == "10^6 images" and got["cost_per_unit_usd"] == pytest.approx(0.5)
    assert got["energy_per_unit_wh"] == pytest.approx(240_000 / 3600 / 1.2)
    # the same as the steady-state figure derive stores for images
    assert got["cost_per_unit_usd"] == pytest.approx(cost_per_million_images_usd(3.6, 1, 2000.0))
    busbw = per_unit({**row, "metric": "avg_busbw", "value": 100.0, "unit": "GB/s"})  # 60,000 GB moved
    assert busbw["per"] == "GB" and busbw["cost_per_unit_usd"] == pytest.approx(0.60 / 60_000)
    legacy = per_unit({"images_per_sec": 2000.0, "duration_s": 600.0, "cost_usd": 0.60, "energy_source": NONE,
                       "energy_j": None})
    assert legacy["cost_per_unit_usd"] == pytest.approx(0.5) and legacy["energy_per_unit_wh"] is None
    for bad in ({"better": "lower", "unit": "ms"}, {"value": 0.0}, {"value": None}, {"duration_s": None},
                {"value": float("inf")}):
        assert per_unit({**row, **bad})["cost_per_unit_usd"] is None
    assert per_unit({**row, "energy_source": ESTIMATED})["energy_per_unit_wh"] is not None
    assert per_unit({**row, "cost_usd": None})["cost_per_unit_usd"] is None
