"""Capacity profiles: the repeated-median fit on synthetic rows with a known answer, bad input, the plan's verdicts,
and the container peak-memory sampler's readings."""

from __future__ import annotations

import json
import random

import pytest

from fleetbench.capacity import (
    Settings,
    assess,
    fit_profiles,
    forced_cases,
    mem_limit_mib,
    plan_capacity,
    repeated_median,
)
from fleetbench.config import ConfigError, parse_config
from fleetbench.params import apply_params
from fleetbench.plan import build_plan
from fleetbench.telemetry.container_memory import PeakMemory, cgroup_files, mib, stats_peak_mib

KEY = ("tf_cnn_benchmarks", "resnet50", "fp32", "gpu", "", "")  # no benchmark in these rows


def row(batch: int, mem, status: str = "ok", device: str = "gpu", **extra) -> dict:
    r = {"model": "resnet50", "batch_size_per_device": batch, "device": device, "status": status,
         "command": ["python", "tf_cnn_benchmarks.py"], "failure_class": None if status == "ok" else "gpu_oom",
         "peak_gpu_mem_mib" if device == "gpu" else "peak_mem_mib": mem}
    r.update(extra)
    return r


def line(batches, a=1000.0, b=40.0, noise=0.0, seed=1) -> list[dict]:
    rng = random.Random(seed)
    return [row(x, a + b * x + rng.gauss(0, noise)) for x in batches]


# -- the fit ---------------------------------------------------------------------------------------
def test_exact_line_is_recovered_with_the_floor_spread():
    p = fit_profiles(line([8, 16, 32, 64]))[KEY]
    assert (p.slope, p.intercept, p.n, p.batches) == (40.0, 1000.0, 4, [8, 16, 32, 64])
    # No residual at all: the spread is the floor, 2 % of the median reading (median of 1320, 1640, 2280, 3560).
    assert p.spread_mib == pytest.approx(0.02 * (1640 + 2280) / 2)
    assert p.predict(128) == pytest.approx(1000 + 40 * 128)


def test_noisy_line_recovers_slope_and_states_a_spread_that_holds_the_points():
    rows = line([8, 16, 24, 32, 48, 64, 96, 128] * 6, noise=20.0)
    p = fit_profiles(rows, Settings(window=1000))[KEY]
    assert p.slope == pytest.approx(40.0, abs=0.5) and p.intercept == pytest.approx(1000.0, abs=25)
    assert 20 <= p.spread_mib <= 100  # 3 sigma of the noise, estimated from the residuals
    inside = sum(abs(r["peak_gpu_mem_mib"] - p.predict(r["batch_size_per_device"])) <= p.spread_mib for r in rows)
    assert inside / len(rows) >= 0.95


def test_an_outlier_does_not_tilt_the_line():
    rows = line([8, 16, 32, 64, 128]) + [row(32, 70000.0)]  # a neighbour's process on the GPU
    p = fit_profiles(rows)[KEY]
    assert p.slope == pytest.approx(40.0) and p.intercept == pytest.approx(1000.0, abs=1)


def test_repeated_median_by_hand():
    # Each point's slopes to the others: (1,1): 2, 0.5 -> 1.25; (2,3): 2, -1 -> 0.5; (3,2): 0.5, -1 -> -0.25; median
    # 0.5. Intercepts 0.5, 2, 0.5 -> 0.5.
    slope, intercept, residuals = repeated_median([(1, 1), (2, 3), (3, 2)])
    assert (slope, intercept) == (0.5, 0.5) and residuals == [0.0, 1.5, 0.0]


def test_one_spike_at_a_batch_size_read_once_does_not_tilt_the_line():
    """Two nights at batches 32, 64 and 128 (2000 + 60 MiB a sample), the second night's 128 missing and the first's
    12 GiB high (a neighbour's process): Theil-Sen's slopes to batch 128 all went through that one reading (slope 124,
    batches 256 and 384 skipped as predicted OOMs on a 40 GiB card that fits them)."""
    rows = [row(32, 3920.0), row(64, 5840.0), row(128, 9680.0 + 12288.0), row(32, 3921.0), row(64, 5842.0)]
    p = fit_profiles(rows)[KEY]
    assert p.slope == pytest.approx(60.0, abs=0.5) and p.intercept == pytest.approx(2000.0, abs=30)


def test_window_keeps_the_newest_points():
    rows = line([8, 16, 32], b=10.0) + line([8, 16, 32], b=100.0)  # newest first: the first three
    p = fit_profiles(rows, Settings(window=3))[KEY]
    assert p.slope == 10.0 and p.n == 3


def test_profiles_are_per_harness_model_precision_and_device():
    rows = (line([8, 16, 32]) + [dict(r, model="vgg16") for r in line([8, 16, 32], b=80.0)]
            + [dict(r, command=["x", "--use_fp16=true"]) for r in line([8, 16, 32], b=20.0)]
            + [row(b, 100.0 + b, device="cpu") for b in (8, 16, 32)])
    profiles = fit_profiles(rows)
    assert {k: p.slope for k, p in profiles.items()} == {
        KEY: 40.0, ("tf_cnn_benchmarks", "vgg16", "fp32", "gpu", "", ""): 80.0,
        ("tf_cnn_benchmarks", "resnet50", "fp16", "gpu", "", ""): 20.0,
        ("tf_cnn_benchmarks", "resnet50", "fp32", "cpu", "", ""): 1.0}


# -- bad input: no prediction and the reason, never a crash ------------------------------------------------
@pytest.mark.parametrize("rows, reason", [
    ([row(32, 2000.0)], "1 usable point(s), fewer than min_points 3"),
    ([row(32, 2000.0), row(32, 2010.0), row(32, 1990.0)], "every point is at one batch size (32): no slope"),
    ([row(8, 3000.0), row(16, 2000.0), row(32, 1000.0)], "peak memory falls as the batch grows"),
    ([row(8, -5.0), row(16, 0.0), row(32, float("nan")), row(64, 1e12), row(64, "lots"), row(8, True)],
     "0 usable point(s)"),
])
def test_bad_input_gives_no_prediction_with_the_reason(rows, reason):
    p = fit_profiles(rows)[KEY]
    assert not p.fitted and p.predict(64) is None and reason in p.reason
    assert reason in p.explain()


def test_readings_at_the_devices_memory_are_no_profile():
    """TensorFlow reserves nearly all of a GPU unless told to grow: every reading sits at the card's memory,
    whatever the batch. Fitted, that line predicted every batch an OOM and skipped every case from the second
    night; it is no prediction, saying why, and the cases run."""
    card = 81920.0
    flat = [row(b, card - 1500 + b / 10, capacity_mib=card) for b in (32, 64, 128, 256) for _ in range(2)]
    p = fit_profiles(flat)[KEY]
    assert not p.fitted and "every reading is at its device's memory (8 of 8 within 5 %)" in p.reason
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in p.reason
    grown = [row(b, 2000 + 250 * b, capacity_mib=card) for b in (32, 64, 128, 256)]  # with allow_growth: a line
    assert fit_profiles(grown)[KEY].fitted
    # TF_FORCE_GPU_ALLOW_GROWTH set after some nights: the reserved readings are left out one by one, and the grown
    # ones draw the line (judged all at once, a few below the mark let the reserved in: every batch an OOM)
    mixed = fit_profiles(grown + flat)[KEY]
    assert mixed.fitted and (mixed.slope, mixed.intercept) == (250.0, 2000.0) and mixed.n == 4
    assert mixed.dropped == {"at its device's memory (reserved up front)": 8}
    assert not fit_profiles(flat + [row(16, 6000.0, capacity_mib=card)])[KEY].fitted  # one usable point: no line


def test_a_flat_floor_is_no_line():
    """Most readings on a fixed part (a CPU case's 54 MiB floor up to batch 1024): the median slope is 0, and every
    batch was predicted to fit (`capacity` suggested batch 1,048,576; batch 8192 was OOM-killed)."""
    readings = [row(b, max(54.0, 18 + 36 / 1024 * b), capacity_mib=256.0) for b in (128, 256, 512, 1024, 2048)]
    p = fit_profiles(readings)[KEY]
    assert not p.fitted and "slope 0" in p.reason


def test_bad_readings_are_dropped_and_counted():
    p = fit_profiles(line([8, 16, 32]) + [row(64, -1.0), row(64, 1e12), row(64, float("inf"))])[KEY]
    assert p.n == 3 and p.slope == 40.0
    assert p.dropped == {"negative or zero": 1, "not a believable number": 2}


def test_failed_rows_other_than_oom_teach_nothing():
    rows = line([8, 16, 32]) + [row(64, 99999.0, status="failed", failure_class="nccl")]
    p = fit_profiles(rows)[KEY]
    assert p.n == 3 and p.ooms == {}


# -- OOMs and misses -----------------------------------------------------------------------------------
def test_an_oom_bounds_only_the_memory_that_ran_out():
    """A GPU case the kernel killed ran out of host or container memory: no bound on its GPU's memory (it
    would skip every batch from there on that GPU); a CPU case's container OOM is its profile's bound."""
    killed = dict(status="failed", failure_class="oom_killed", capacity_mib=81920.0, capacity_note="fits: 9 MiB")
    gpu = fit_profiles(line([8, 16, 32]) + [row(64, None, **killed)])[KEY]
    assert gpu.ooms == {} and gpu.misses == [] and gpu.known_oom(64, 81920.0) is None
    cpu_rows = [row(b, 100.0 + b, device="cpu") for b in (8, 16, 32)] + [
        row(64, None, device="cpu", **{**killed, "capacity_mib": 256.0}),
        row(128, None, device="cpu", status="failed", failure_class="gpu_oom", capacity_mib=256.0)]
    cpu = fit_profiles(cpu_rows)[KEY[:3] + ("cpu", "", "")]
    assert cpu.ooms == {256.0: 64} and len(cpu.misses) == 1


def test_smallest_oom_batch_per_memory_size_and_misses():
    rows = line([8, 16, 32]) + [
        row(128, None, status="failed", capacity_mib=16384.0),
        row(64, None, status="failed", capacity_mib=16384.0,
            capacity_note="fits: 3560 +- 20 MiB of 14746 MiB", predicted_mem_mib=3560.0, run_id="r9", host="h"),
        row(256, None, status="failed", capacity_mib=40960.0),
        row(32, None, status="failed"),  # capacity unknown: not a bound
    ]
    p = fit_profiles(rows)[KEY]
    assert p.ooms == {16384.0: 64, 40960.0: 256}
    assert [(m["run_id"], m["predicted_mem_mib"], m["failure_class"]) for m in p.misses] == [
        ("r9", 3560.0, "gpu_oom")]
    assert p.known_oom(64, 16384.0) == (64, 16384.0) and p.known_oom(64, 8192.0) == (64, 16384.0)
    assert p.known_oom(63, 16384.0) is None and p.known_oom(64, 32768.0) is None
    # 16 GiB less 10 %: (14745.6 - spread - 1000) / 40 -> 343, but batch 64 died with 16 GiB.
    assert p.largest_fitting(16384.0, 10.0) == 63
    assert p.largest_fitting(81920.0, 10.0) == int((81920 * 0.9 - p.spread_mib - 1000) // 40)


def test_a_newer_ok_result_at_the_batch_lifts_an_oom_bound():
    """A stray OOM at batch 64 on 16 GiB, then a `force_cases` rerun that ran 64 ok on 16 GiB: the bound is gone
    (it made every later night a `known OOM` again). An ok older than the OOM, at a smaller batch or on more
    memory proves nothing, and the miss stays a miss."""
    oom = row(64, None, status="failed", capacity_mib=16384.0, logical_date="2026-12-02T02:00:00+00:00",
              capacity_note="fits: 3560 +- 20 MiB of 14746 MiB", run_id="r2")

    def ok(batch, day, cap=16384.0):
        return row(batch, 1000.0 + 40 * batch, capacity_mib=cap, logical_date=f"2026-12-{day:02d}T02:00:00+00:00")

    base = [ok(8, 1), ok(16, 1), ok(32, 1)]
    assert fit_profiles([ok(64, 3), *base, oom])[KEY].ooms == {}  # forced the next night: ran
    assert fit_profiles([ok(128, 3), *base, oom])[KEY].ooms == {}  # a larger batch ran on as much memory
    lifted = fit_profiles([ok(64, 3), *base, oom])[KEY]
    assert lifted.known_oom(64, 16384.0) is None and [m["run_id"] for m in lifted.misses] == ["r2"]
    for evidence in (ok(64, 1), ok(32, 3), ok(64, 3, cap=40960.0)):  # older; smaller batch; more memory
        assert fit_profiles([evidence, *base, oom])[KEY].ooms == {16384.0: 64}, evidence
    assert fit_profiles([*base, {**oom, "logical_date": None}, ok(64, 3)])[KEY].ooms == {16384.0: 64}


def test_the_warehouse_read_lifts_an_oom_bound_a_later_night_disproved(tmp_path):
    """Through a real SQLite warehouse (`read_rows` groups OOM rows per batch with their newest night)."""
    from fleetbench.capacity import read_rows
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from warehouse_rows import result_row, run_row

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)

    def night(run: str, day: int, *rows: dict) -> None:
        date = f"2026-12-{day:02d}T02:00:00+00:00"
        store_run(engine, {**run_row(run), "logical_date": date},
                  [], [{**r, "run_id": run, "logical_date": date} for r in rows], [])

    def case(batch: int, ok: bool = True) -> dict:
        return result_row(f"cnn.resnet50.bs{batch}.g1.replicated", batch_size_per_device=batch, capacity_mib=16384.0,
                          status="ok" if ok else "failed", ips=100.0 if ok else None,
                          peak_gpu_mem_mib=1000.0 + 40 * batch if ok else None)

    cnn = KEY[:5] + ("cnn",)  # result_row's benchmark
    night("r1", 1, case(8), case(16), case(64))
    night("r2", 2, case(8), case(16), case(64, ok=False))  # a stray OOM after an ok night
    assert fit_profiles(read_rows(engine, ["resnet50"]))[cnn].ooms == {16384.0: 64}
    night("r3", 3, case(64))  # forced: ran
    assert fit_profiles(read_rows(engine, ["resnet50"]))[cnn].ooms == {}
    night("r4", 4, case(128, ok=False))  # a real bound later on still counts
    assert fit_profiles(read_rows(engine, ["resnet50"]))[cnn].ooms == {16384.0: 128}


def test_torch_synthetic_compile_and_channels_last_are_profiles_of_their_own(tmp_path):
    """Eager and compiled (and channels_last) cases need very different memory at one batch: an eager OOM must not
    skip the compiled case that ran at that batch, a compiled ok must not lift the eager bound, and eager readings
    must not tilt the compiled line. Through a real SQLite warehouse: `read_rows` groups these bounds by command."""
    from fleetbench.capacity import read_rows
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from warehouse_rows import result_row, run_row

    cfg = {"hosts": [{"name": "g"}],
           "images": [{"name": "pt", "ref": "127.0.0.1:5000/pt:1", "command": ["python", "torch_synthetic.py"]}],
           "benchmarks": [{"name": "pt", "image": "pt", "harness": "torch_synthetic", "models": ["resnet50"],
                           "batch_sizes": [64, 128, 256], "num_gpus": [1], "precisions": ["bf16"],
                           "compile": [False, True], "channels_last": [False, True]}]}
    plan = build_plan(parse_config(cfg), {"dag_id": "d", "run_id": "r"})
    cases = {tuple(c.case_key.split(".")[-2:]) + (c.batch_size_per_device,): c for c in plan.cases}
    need = {"eager": lambda b: 1500.0 + 160 * b, "compiled": lambda b: 1000.0 + 94 * b}  # MiB; eager 256: 42460
    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)

    def night(run: str, day: int, keys) -> None:
        date = f"2026-12-{day:02d}T02:00:00+00:00"
        rows = []
        for layout, mode, batch in keys:
            case, mib = cases[(layout, mode, batch)], need[mode](batch)
            ok = mib < 40960.0 and layout == "nchw"  # every channels_last case died: its own bound, nobody else's
            rows.append(result_row(case.case_key, run_id=run, host="g", logical_date=date, model="resnet50",
                                   benchmark="pt",
                                   batch_size_per_device=batch, harness="torch_synthetic", precision="bf16",
                                   command=case.command, capacity_mib=40960.0, status="ok" if ok else "failed",
                                   ips=100.0 if ok else None, peak_gpu_mem_mib=mib if ok else None))
        store_run(engine, {**run_row(run), "logical_date": date}, [], rows, [])

    night("r1", 1, [(layout, mode, b) for layout in ("nchw", "nhwc") for mode in need for b in (64, 128, 256)])
    night("r2", 2, [("nchw", "compiled", 256)])  # compiled 256 ran again after the eager OOM: not eager's evidence
    profiles = fit_profiles(read_rows(engine, ["resnet50"]))
    assert {k[4]: p.ooms for k, p in profiles.items()} == {
        "channels_last=0,compile=0": {40960.0: 256}, "channels_last=0,compile=1": {},
        "channels_last=1,compile=0": {40960.0: 64}, "channels_last=1,compile=1": {40960.0: 64}}
    compiled = profiles[("torch_synthetic", "resnet50", "bf16", "gpu", "channels_last=0,compile=1", "pt")]
    assert (compiled.slope, compiled.intercept) == (94.0, 1000.0)

    def verdict(layout: str, mode: str, batch: int) -> dict:
        return assess(cases[(layout, mode, batch)], profiles, {"g": 40960.0}, Settings())

    assert verdict("nchw", "compiled", 256)["action"] == "run"
    assert verdict("nchw", "compiled", 256)["note"].startswith("fits: 25064 +- ")
    assert verdict("nchw", "eager", 256)["action"] == "skip"
    assert verdict("nchw", "eager", 256)["note"].startswith("known OOM: batch 256 died of OOM with 40960 MiB")
    assert verdict("nhwc", "compiled", 64)["note"].startswith("known OOM: batch 64")


# -- the plan's verdict per case ------------------------------------------------------------------------
def plan_cfg(batches, on_predicted_oom="skip", mem_limit="256m", **capacity) -> dict:
    return {
        "fleet": {"capacity": {"on_predicted_oom": on_predicted_oom, **capacity}},
        "hosts": [{"name": "h1"}],
        "images": [{"name": "cpu", "ref": "127.0.0.1:5000/x:1", "command": ["python3", "tf_cnn_benchmarks.py"]}],
        "benchmarks": [{"name": "smoke", "image": "cpu", "device": "cpu", "models": ["trivial"],
                        "batch_sizes": batches, "num_gpus": [0], "variable_update": ["parameter_server"],
                        "container": {"mem_limit": mem_limit} if mem_limit else {}}],
    }


def cpu_rows(batches, a=18.0, b=36.0 / 1024) -> list[dict]:
    return [{"model": "trivial", "batch_size_per_device": x, "device": "cpu", "status": "ok", "benchmark": "smoke",
             "command": ["python3", "tf_cnn_benchmarks.py"], "peak_mem_mib": a + b * x} for x in batches]


class _Engine:
    """Stands in for the warehouse in plan_capacity: what read_rows and read_gpu_memory would return."""


def verdicts(cfg: dict, rows: list[dict], params: dict | None = None, monkeypatch=None) -> dict:
    import fleetbench.capacity as cap

    monkeypatch.setattr(cap, "read_rows", lambda engine, models: rows)
    monkeypatch.setattr(cap, "read_gpu_memory", lambda engine, hosts: {})
    monkeypatch.setattr(cap, "has_results", lambda engine: True)
    plan = build_plan(apply_params(parse_config(cfg), params), {"dag_id": "d", "run_id": "r"}, params)
    return {c.case_key.split(".")[2]: c.capacity for c in plan_capacity(plan, engine=_Engine()).cases}


def test_plan_skips_the_batch_that_exceeds_the_limit_and_runs_the_rest(monkeypatch):
    v = verdicts(plan_cfg([2048, 5120, 8192]), cpu_rows([2048, 3072, 4096, 5120, 6144]), monkeypatch=monkeypatch)
    assert v["bs8192"]["action"] == "skip" and v["bs8192"]["note"].startswith("predicted OOM: 306 +- 3 MiB")
    assert v["bs8192"]["capacity_mib"] == 256.0 and v["bs8192"]["predicted_mem_mib"] == pytest.approx(306.0, abs=0.01)
    assert v["bs2048"]["action"] == v["bs5120"]["action"] == "run"
    assert v["bs5120"]["note"].startswith("fits: 198 +- 3 MiB of 230 MiB (container limit 256 MiB less 10 %)")


def test_too_few_points_for_confidence_only_warns(monkeypatch):
    v = verdicts(plan_cfg([8192]), cpu_rows([2048, 3072, 4096]), monkeypatch=monkeypatch)
    assert v["bs8192"]["action"] == "warn" and "fewer than confident_points 5: warn only" in v["bs8192"]["note"]
    v = verdicts(plan_cfg([8192], confident_points=3), cpu_rows([2048, 3072, 4096]), monkeypatch=monkeypatch)
    assert v["bs8192"]["action"] == "skip"


@pytest.mark.parametrize("setting", ["warn", "run"])
def test_the_setting_decides(setting, monkeypatch):
    v = verdicts(plan_cfg([8192], on_predicted_oom=setting), cpu_rows([2048, 3072, 4096, 5120, 6144]),
                 monkeypatch=monkeypatch)
    assert v["bs8192"]["action"] == setting and v["bs8192"]["note"].startswith("predicted OOM")


def test_force_cases_runs_a_predicted_oom_and_names_unknown_cases(monkeypatch):
    rows = cpu_rows([2048, 3072, 4096, 5120, 6144])
    v = verdicts(plan_cfg([5120, 8192]), rows, {"force_cases": ["h1/smoke.trivial.bs8192.g0.parameter_server"]},
                 monkeypatch=monkeypatch)
    assert v["bs8192"]["action"] == "run" and v["bs8192"]["note"].endswith("forced by force_cases")
    with pytest.raises(ConfigError, match=r"force_cases\[0\]: 'smoke.trivial.bs1.g0.parameter_server' is not a case"):
        verdicts(plan_cfg([8192]), rows, {"force_cases": ["smoke.trivial.bs1.g0.parameter_server"]},
                 monkeypatch=monkeypatch)
    with pytest.raises(ConfigError, match=r"force_cases\[0\]: 'a b' is not a case_key"):
        apply_params(parse_config(plan_cfg([8192])), {"force_cases": ["a b"]})


def test_unknown_capacity_or_no_profile_runs_with_the_reason(monkeypatch):
    v = verdicts(plan_cfg([8192], mem_limit=None), cpu_rows([2048, 3072, 4096, 5120, 6144]), monkeypatch=monkeypatch)
    assert v["bs8192"] == {"action": "run", "capacity_mib": None, "predicted_mem_mib": None, "spread_mib": None,
                           "note": "no prediction: the case has no container memory limit"}
    v = verdicts(plan_cfg([8192]), [], monkeypatch=monkeypatch)
    assert v["bs8192"]["action"] == "run" and v["bs8192"]["note"].startswith("no prediction: no result")
    v = verdicts(plan_cfg([8192]), cpu_rows([4096]), monkeypatch=monkeypatch)
    assert v["bs8192"]["action"] == "run" and "fewer than min_points" in v["bs8192"]["note"]


def test_unreadable_warehouse_runs_everything_with_the_reason(tmp_path):
    from fleetbench.warehouse import get_engine

    plan = build_plan(parse_config(plan_cfg([8192])), {"dag_id": "d", "run_id": "r"})
    (case,) = plan_capacity(plan, engine=get_engine(f"sqlite:///{tmp_path}/new.db")).cases  # nothing stored yet
    assert case.capacity["action"] == "run"
    assert case.capacity["note"].startswith("no prediction: no result of this benchmark, harness, model")

    class Broken:
        def connect(self):
            raise RuntimeError("no such table: capacity_features")

    (case,) = plan_capacity(plan, engine=Broken()).cases
    assert case.capacity["action"] == "run" and "the warehouse could not be read" in case.capacity["note"]
    assert case.capacity["capacity_mib"] == 256.0


def test_a_model_less_command_benchmark_leaves_the_others_predicted(tmp_path):
    """A `command` benchmark's cases have no model: next to a tf_cnn benchmark they must not make the warehouse
    read fail, which took the prediction of every case of the run."""
    from fleetbench.warehouse import get_engine, store_run, upgrade
    from warehouse_rows import result_row, run_row

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)
    store_run(engine, run_row("r0"), [], [
        result_row(f"smoke.trivial.bs{r['batch_size_per_device']}.g0.parameter_server", run_id="r0", **r,
                   harness="tf_cnn_benchmarks", peak_gpu_mem_mib=None) for r in cpu_rows([2048, 3072, 4096, 5120, 6144])
    ], [])
    cfg = plan_cfg([5120, 8192])
    cfg["benchmarks"].append({"name": "serve", "image": "cpu", "harness": "command", "device": "cpu",
                              "command": ["python3", "serve.py"], "num_gpus": [0]})
    plan = plan_capacity(build_plan(parse_config(cfg), {"dag_id": "d", "run_id": "r"}), engine=engine)
    notes = {c.case_key: c.capacity["note"] for c in plan.cases}
    assert notes["smoke.trivial.bs5120.g0.parameter_server"].startswith("fits: 198 +- 3 MiB")
    assert notes["smoke.trivial.bs8192.g0.parameter_server"].startswith("predicted OOM: 306 +- 3 MiB")
    assert not notes["serve.g0"].startswith("no prediction: the warehouse could not be read"), notes["serve.g0"]


def test_a_hosts_first_night_stores_its_gpu_memory_from_the_nights_check():
    """The plan knows no GPU memory on a host's first night (no facts stored yet): its rows kept no capacity, so a
    TensorFlow fleet's readings (the whole card, reserved up front) could not be told from real needs, and a line
    at the card's memory skipped every case from the second night on, for good."""
    from fleetbench.hosts.facts import Gpu, HostFacts
    from fleetbench.measure import result_row
    from fleetbench.plan import Case
    from fleetbench.run_model import RunInfo

    case = Case(host="g", case_key="k", benchmark="b", image="i", model="resnet50", batch_size_per_device=64,
                num_gpus=1, variable_update="replicated", device="gpu", num_batches=1, num_warmup_batches=0,
                timeout_s=60, command=["python", "tf_cnn_benchmarks.py"],
                capacity={"action": "run", "capacity_mib": None, "note": "no prediction: the GPU memory of host g is "
                          "not known yet"})
    facts = HostFacts(gpus=[Gpu(0, "NVIDIA A100-SXM4-40GB", None, 40960), Gpu(1, "NVIDIA A100-SXM4-40GB", None,
                                                                                  40960)])
    verdict = type("V", (), {"host_facts": facts, "checks": []})()
    stored = result_row(RunInfo(dag_id="d", run_id="r"), case, verdict, None, {"status": "ok"})
    assert stored["capacity_mib"] == 40960 and stored["capacity_note"].startswith("no prediction")
    assert result_row(RunInfo(dag_id="d", run_id="r"), case, None, None, {"status": "ok"})["capacity_mib"] is None
    # the stored facts were the night before's: a card swapped since (80 GB -> 40 GB) is recorded as tonight's
    import dataclasses

    swapped = dataclasses.replace(case, capacity={"action": "run", "capacity_mib": 81920.0, "note": "fits: ..."})
    oom = result_row(RunInfo(dag_id="d", run_id="r"), swapped, verdict, None, {"status": "failed",
                                                                               "failure_class": "gpu_oom"})
    assert oom["capacity_mib"] == 40960 and oom["capacity_note"].startswith("fits: ...")
    # the night's readings, the card reserved up front, are then no line: the cases of the next nights run
    nights = [row(b, 40960 - 600 + b / 10, capacity_mib=40960.0, benchmark="b") for b in (32, 64, 128, 256, 512)]
    p = fit_profiles(nights)[KEY[:5] + ("b",)]
    assert not p.fitted and "reserved the memory up front" in p.reason
    assert assess(case, {p.key: p}, {"g": 40960.0}, Settings())["action"] == "run"


def test_gpu_case_on_a_host_of_unknown_memory_is_not_predicted():
    from fleetbench.plan import Case

    case = Case(host="g", case_key="k", benchmark="b", image="i", model="resnet50", batch_size_per_device=512,
                num_gpus=1, variable_update="replicated", device="gpu", num_batches=1, num_warmup_batches=0,
                timeout_s=60, command=["python", "tf_cnn_benchmarks.py"])
    profiles = fit_profiles([dict(r, benchmark="b") for r in line([8, 16, 32, 64, 128])])
    v = assess(case, profiles, {"g": None}, Settings())
    assert v["action"] == "run" and v["note"] == "no prediction: the GPU memory of host g is not known yet"
    v = assess(case, profiles, {"g": 16384.0}, Settings())  # 1000 + 40 x 512 = 21480 MiB > 16 GiB
    assert v["action"] == "skip" and v["predicted_mem_mib"] == 21480.0


def test_an_ok_result_at_the_batch_wins_over_the_line():
    """A case near its limit (inside the margin) that ran, forced once as README suggests, was still a predicted OOM
    every night after: the line, one point heavier, said the same. An ok result at that batch or above on as much
    memory or less now plans it again; on less memory than it ran with, the line still decides."""
    from fleetbench.plan import Case

    case = Case(host="g", case_key="k", benchmark="b", image="i", model="resnet50", batch_size_per_device=512,
                num_gpus=1, variable_update="replicated", device="gpu", num_batches=1, num_warmup_batches=0,
                timeout_s=60, command=["python", "tf_cnn_benchmarks.py"])
    night = {"benchmark": "b", "capacity_mib": 24576.0, "logical_date": "2026-11-01T02:00:00+00:00"}
    rows = [dict(r, **night) for r in line([8, 16, 32, 64, 128])]  # 1000 + 40 x batch: 21480 MiB at 512
    assert assess(case, fit_profiles(rows), {"g": 22528.0}, Settings())["action"] == "skip"  # usable 20275 MiB
    forced = dict(row(512, 21480.0), **{**night, "capacity_mib": 22528.0, "logical_date": "2026-12-01T02:00:00+00:00"})
    v = assess(case, fit_profiles([forced, *rows]), {"g": 22528.0}, Settings())
    assert v["action"] == "run" and v["note"].startswith("fits: ran ok at batch 512 with 22528 MiB"), v
    assert assess(case, fit_profiles([forced, *rows]), {"g": 22000.0}, Settings())["action"] == "skip"


def test_forced_cases_expand_a_bare_case_key_to_every_host():
    cfg = plan_cfg([8192])
    cfg["hosts"].append({"name": "h2"})
    plan = build_plan(parse_config(cfg), {"dag_id": "d", "run_id": "r"})
    assert forced_cases(plan, ["smoke.trivial.bs8192.g0.parameter_server"]) == {
        ("h1", "smoke.trivial.bs8192.g0.parameter_server"), ("h2", "smoke.trivial.bs8192.g0.parameter_server")}


def test_forced_cases_name_a_multi_node_case_by_any_host_of_its_set():
    cfg = plan_cfg([8192])
    cfg["hosts"] += [{"name": "h2"}, {"name": "h3"}]
    cfg["benchmarks"][0].update(nodes=[2])
    plan = build_plan(parse_config(cfg), {"dag_id": "d", "run_id": "r"})
    key = "smoke.trivial.bs8192.g0.parameter_server.n2.h1+h2"
    assert key in {c.case_key for c in plan.cases}
    for host in ("h1", "h2"):
        assert forced_cases(plan, [f"{host}/{key}"]) == {("h1", key)}
    with pytest.raises(ConfigError, match=r"force_cases\[0\]: 'h3/smoke.*n2.h1\+h2' is not a case of this run's plan"):
        forced_cases(plan, [f"h3/{key}"])


@pytest.mark.parametrize("value, expected", [("256m", 256.0), ("2g", 2048.0), ("1048576", 1.0), ("512k", 0.5),
                                             (None, None), ("0", None), ("lots", None)])
def test_mem_limit_mib(value, expected):
    assert mem_limit_mib(value) == expected


# -- the sampler's readings ------------------------------------------------------------------------------
def test_readings_in_mib_and_what_is_not_one():
    assert mib(268435456) == 256.0 and mib("1048576") == 1.0
    assert [mib(v) for v in (0, -1, "x", None, float("nan"), 2**60)] == [None] * 6
    assert stats_peak_mib({"memory_stats": {"usage": 2 * 2**20, "max_usage": 3 * 2**20}}) == 3.0  # cgroup v1
    assert stats_peak_mib({"memory_stats": {"usage": 2 * 2**20}}) == 2.0  # cgroup v2: usage only
    assert stats_peak_mib({}) is None


def test_sampler_reads_a_cgroup_file_and_keeps_the_peak(tmp_path):
    path, source = cgroup_files("c0ffee", tmp_path)[2]  # cgroup v1, cgroupfs driver
    path.parent.mkdir(parents=True)
    path.write_text("104857600\n")
    sampler = PeakMemory(cli=None, cid="c0ffee", local=True, period_s=0.01, root=tmp_path).start()
    path.write_text("209715200\n")
    assert sampler.stop() == (200.0, "cgroup_v1")


def test_sampler_falls_back_to_engine_stats_for_a_remote_engine():
    class Cli:
        def stats(self, cid, decode, stream):
            assert (cid, decode, stream) == ("abc", True, True)
            yield {"memory_stats": {"usage": 50 * 2**20}}
            yield {"memory_stats": {"usage": 70 * 2**20}}
            yield {"memory_stats": {"usage": -1}}  # a bad sample is ignored

    sampler = PeakMemory(cli=Cli(), cid="abc", local=False).start()
    sampler._thread.join(timeout=5)
    assert sampler.stop() == (70.0, "engine_stats")


def test_gpu_memory_comes_from_each_hosts_newest_facts(tmp_path):
    import json as _json

    from fleetbench.capacity import read_gpu_memory
    from fleetbench.warehouse import get_engine, upgrade
    from fleetbench.warehouse.schema import host_facts

    engine = get_engine(f"sqlite:///{tmp_path}/w.db")
    upgrade(engine)

    def facts(run: str, host: str, day: int, gpus) -> dict:
        from datetime import datetime, timezone

        return {"dag_id": "d", "run_id": run, "host": host, "verdict": "ready", "facts_json": _json.dumps(gpus),
                "collected_at": datetime(2026, 12, day, tzinfo=timezone.utc)}

    with engine.begin() as conn:
        conn.execute(host_facts.insert(), [
            facts("r1", "g", 1, {"gpus": [{"memory_total_mib": 16384}]}),
            facts("r2", "g", 2, {"gpus": [{"memory_total_mib": 81559}, {"memory_total_mib": 40960}]}),  # newest
            facts("r2", "cpu", 2, {"gpus": []}),
            facts("r2", "odd", 2, {"gpus": [{"memory_total_mib": -5}, {"memory_total_mib": "x"}]}),
            facts("r2", "broken", 2, ["not", "a", "mapping"]),
            # a night the host could not be checked stored no GPUs: the night before's memory still holds (was None:
            # the plan knew no memory, and the host's known-OOM cases ran again)
            facts("r1", "t4", 1, {"gpus": [{"memory_total_mib": 15360}]}),
            facts("r2", "t4", 2, {"gpus": None}),
        ])
    assert read_gpu_memory(engine, ["g", "cpu", "odd", "broken", "absent", "t4"]) == {
        "g": 40960.0, "cpu": None, "odd": None, "broken": None, "t4": 15360.0}


def test_two_benchmarks_of_one_model_are_profiles_of_their_own():
    """A training and a forward-only benchmark of resnet50 need very different memory at one batch: one line through
    both predicted nonsense, and the training OOM skipped the inference case at that batch for good."""
    train = [dict(r, benchmark="train") for r in line([32, 64, 128], a=2000.0, b=80.0)]
    infer = [dict(r, benchmark="infer") for r in line([32, 64, 128, 512], a=1500.0, b=12.0)]
    oom = row(512, None, status="failed", benchmark="train", capacity_mib=32510.0, logical_date="2026-12-02")
    profiles = fit_profiles([*train, *infer, oom])
    t, i = profiles[KEY[:5] + ("train",)], profiles[KEY[:5] + ("infer",)]
    assert (t.slope, i.slope) == (80.0, 12.0) and t.ooms == {32510.0: 512} and i.ooms == {}


def test_mig_readings_are_not_points_of_the_whole_gpu_profile():
    """NVML reads a MIG case's whole board (and TF reserves the instance): such readings bent the whole-GPU line."""
    whole = line([8, 16, 32, 64, 128])
    mig = [row(b, 9700.0, mig_profile="1g.10gb") for b in (8, 64, 512)]
    p = fit_profiles([*whole, *mig])[KEY]
    assert (p.slope, p.intercept, p.n, p.dropped) == (40.0, 1000.0, 5, {"MIG instance": 3})


def test_a_multi_node_case_is_judged_against_its_sets_smallest_gpu():
    from fleetbench.capacity import case_capacity
    from fleetbench.plan import Case

    case = Case(host="a100", host_set=["a100", "rtx3070"], case_key="k", benchmark="b", image="i", model="resnet50",
                batch_size_per_device=64, num_gpus=1, variable_update="distributed_replicated", device="gpu",
                num_batches=1, num_warmup_batches=0, timeout_s=60, command=["python"], nodes=2)
    assert case_capacity(case, {"a100": 40960.0, "rtx3070": 8192.0}) == (
        8192.0, "GPU memory of the set's smallest (2 hosts)")
    assert case_capacity(case, {"a100": 40960.0}) == (None, "the GPU memory of host rtx3070 is not known yet")


def test_a_data_parallel_torch_case_is_a_profile_of_its_own_gpu_count():
    """torch_synthetic on several GPUs in one process (DataParallel) makes the whole input batch on GPU 0, whose
    peak memory at a batch per device grows with the GPU count: 4-GPU readings are not points of the 1-GPU
    profile (nor its OOMs a bound for 1 GPU). CPU cases and launcher ranks (one GPU each) have no such term."""
    from fleetbench.capacity import key_of

    def cmd(*flags):
        return ["python3", "/opt/fleetbench/torch_synthetic.py", "--model=resnet50", "--batch_size=64",
                "--precision=fp32", "--channels_last=0", "--compile=0", *flags]

    def variant(command):
        return key_of({"harness": "torch_synthetic", "model": "resnet50", "device": "gpu", "command": command})[4]

    assert variant(cmd("--device=cuda", "--num_gpus=1")) == "channels_last=0,compile=0"
    assert variant(cmd("--device=cuda", "--num_gpus=4")) == "channels_last=0,compile=0,data_parallel=4"
    assert variant(json.dumps(cmd("--device=cuda", "--num_gpus=2"))) == "channels_last=0,compile=0,data_parallel=2"
    assert variant(cmd("--device=cpu", "--num_gpus=1")) == "channels_last=0,compile=0"
    assert variant(["torchrun", "--nproc_per_node=4", *cmd("--device=cuda", "--num_gpus=4")[1:]]) == (
        "channels_last=0,compile=0")
