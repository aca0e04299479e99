"""A driver-upgrade scenario with known truth, run through the warehouse and the regression detector.

20 hosts x 10 cases x 40 nights. Each case has its own night-to-night noise (0.3 % to 4 % CV); one
night in 30 of a (host, case) is a one-night outlier (-20 % throughput; never two nights in a row);
three hosts drift slowly (-0.1 % a night); five hosts get a new driver (and CUDA driver) at night 30,
and each of their cases changes by one of -2/-5/-10/-25/+10 % from then on. Nights are stored with
`store_run` as the DAG stores them, then each night is assessed and its findings stored in order,
as the DAG's compare step does. `evaluate` reads the `regressions` table back and scores it.

Used by tests/unit/test_regression_scenario.py (targets asserted) and bench/bench_regression.py.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np

DAG = "fleet_benchmark"
NIGHT0 = datetime(2026, 10, 1, 2, 0, tzinfo=timezone.utc)
OLD_DRIVER, NEW_DRIVER = ("535.104.05", "12.2"), ("550.54.14", "12.4")
DIGEST = "sha256:" + "d" * 64
# (model, GPUs, images/sec of one host, night-to-night CV)
CASES = [("alexnet", 1, 2800.0, 0.003), ("resnet50", 1, 410.0, 0.005), ("vgg16", 1, 240.0, 0.008),
         ("inception3", 1, 270.0, 0.010), ("resnet152", 1, 160.0, 0.013), ("alexnet", 8, 21000.0, 0.017),
         ("resnet50", 8, 3150.0, 0.020), ("vgg16", 8, 1800.0, 0.025), ("inception3", 8, 2050.0, 0.030),
         ("resnet152", 8, 1200.0, 0.040)]
EFFECTS = (-0.02, -0.05, -0.10, -0.25, 0.10)
CHANGED_HOSTS = 5  # hosts 0..4 change driver at CHANGE_NIGHT
DRIFT_HOSTS = (15, 16, 17)
DRIFT_PER_NIGHT = -0.001
CHANGE_NIGHT = 30
OUTLIER_RATE, OUTLIER_EFFECT = 1 / 30, -0.20
STEPS, STEP_CV = 100, 0.02
PRICE_PER_GPU_HOUR, POWER_W = 2.0, 300.0
BANDS = (("< 1 %", 0.0, 0.01), ("1-2 %", 0.01, 0.02), (">= 2 %", 0.02, 1.0))


def case_key(model: str, gpus: int) -> str:
    return f"cnn.{model}.bs64.g{gpus}"


def night_run_id(n: int) -> str:
    return f"scheduled__{(NIGHT0 + timedelta(days=n)).isoformat()}"


@dataclass
class Scenario:
    """The generated nights (result rows per night) and the truth about every (host, case, night)."""

    seed: int
    hosts: int
    nights: int
    rows: list[list[dict]] = field(default_factory=list)  # per night
    effect: dict[tuple[str, str], float] = field(default_factory=dict)  # changed (host, case) -> effect
    outliers: set[tuple[str, str, int]] = field(default_factory=set)
    noise: dict[str, float] = field(default_factory=dict)  # case_key -> CV


def generate(seed: int = 24, hosts: int = 20, nights: int = 40) -> Scenario:
    """The scenario's rows, seeded (same seed, same rows)."""
    rng = np.random.default_rng(seed)
    sc = Scenario(seed=seed, hosts=hosts, nights=nights)
    host_names = [f"gpu{h:02d}" for h in range(hosts)]
    speed = {h: float(rng.normal(1.0, 0.02)) for h in host_names}
    for c, (model, gpus, _, cv) in enumerate(CASES):
        sc.noise[case_key(model, gpus)] = cv
    for h in range(min(CHANGED_HOSTS, hosts)):
        for c, (model, gpus, _, _) in enumerate(CASES):
            sc.effect[(host_names[h], case_key(model, gpus))] = EFFECTS[(h + c) % len(EFFECTS)]
    for n in range(nights):
        night = []
        when = NIGHT0 + timedelta(days=n)
        for h, host in enumerate(host_names):
            changed = h < CHANGED_HOSTS and n >= CHANGE_NIGHT
            driver, cuda = NEW_DRIVER if changed else OLD_DRIVER
            drift = 1 + DRIFT_PER_NIGHT * n if h in DRIFT_HOSTS else 1.0
            for model, gpus, base, cv in CASES:
                key = case_key(model, gpus)
                value = base * speed[host] * drift * (1 + rng.normal(0.0, cv))
                if changed:
                    value *= 1 + sc.effect[(host, key)]
                if n > 0 and rng.random() < OUTLIER_RATE and (host, key, n - 1) not in sc.outliers:
                    value *= 1 + OUTLIER_EFFECT
                    sc.outliers.add((host, key, n))
                images = 64 * gpus * 1000
                duration = 20.0 + images / value
                night.append({
                    "dag_id": DAG, "run_id": night_run_id(n), "logical_date": when.isoformat(), "host": host,
                    "case_key": key, "benchmark": "cnn", "model": model, "batch_size_per_device": 64,
                    "batch_size_global": 64 * gpus, "num_gpus": gpus, "device": "gpu", "num_batches": 1000,
                    "image_name": "tf1", "image_ref": "127.0.0.1:5000/tf:1", "image_digest": DIGEST,
                    "status": "ok", "images_per_sec": value, "step_count": STEPS, "exit_code": 0,
                    "duration_s": duration, "driver_version": driver, "cuda_driver_version": cuda,
                    "gpu_model": "NVIDIA H100 80GB HBM3", "energy_source": "estimated",
                    "energy_j": POWER_W * gpus * duration, "step_cv": STEP_CV,
                    "cost_usd": PRICE_PER_GPU_HOUR * gpus * duration / 3600, "price_per_gpu_hour": PRICE_PER_GPU_HOUR,
                })
        sc.rows.append(night)
    return sc


def store_nights(engine, sc: Scenario, upto: int | None = None) -> None:
    """Write nights 0..upto-1 (all by default) with `store_run`, as the DAG does."""
    from fleetbench.warehouse import store_run

    for n, night in enumerate(sc.rows[:upto]):
        run = {"dag_id": DAG, "run_id": night_run_id(n), "logical_date": night[0]["logical_date"],
               "run_type": "scheduled", "fleet": "scenario", "cases_total": len(night), "cases_ok": len(night),
               "cases_failed": 0, "cases_skipped": 0}
        store_run(engine, run, [], night)


def detect_nights(engine, sc: Scenario, settings=None, first: int = 0) -> None:
    """Assess each night from `first` on and store its findings, in night order (the DAG's compare step)."""
    from fleetbench.regression import assess_run, store_findings

    for n in range(first, sc.nights):
        found = assess_run(engine, DAG, night_run_id(n), settings)
        store_findings(engine, DAG, night_run_id(n), found.findings)


def band_of(cv: float) -> str:
    return next(name for name, lo, hi in BANDS if lo <= cv < hi)


def stored_findings(engine) -> list[dict]:
    from sqlalchemy import select

    from fleetbench.warehouse.schema import regressions

    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(regressions).where(regressions.c.dag_id == DAG))]


def evaluate(engine, sc: Scenario, metric: str = "images_per_sec") -> dict:
    """Score the stored findings of `metric` against the truth.

    A check is one (host, case, night) that had a verdict (a baseline); "unchanged" checks are those
    without an injected change (outlier nights included). A finding's status is "confirmed" unless
    stored as "suspected" (a table without a status column stores every finding as an alarm).
    Recall per effect: a changed (host, case) with a confirmed regression (improvement for +10 %) on
    some night from the change on; "open on the last night": the last night has it confirmed.
    """
    night_of = {night_run_id(n): n for n in range(sc.nights)}
    found: dict[tuple[str, str, int], dict] = {}
    for f in stored_findings(engine):
        if f["metric"] == metric:
            found[(f["host"], f["case_key"], night_of[f["run_id"]])] = f

    def status(f):
        return f.get("status") or "confirmed"

    def kind(f):
        return f.get("kind") or "regression"

    checks, alarms, suspected = defaultdict(int), defaultdict(int), defaultdict(int)
    noise_alarms = defaultdict(int)
    outlier_confirmed = outlier_flagged = 0
    for n in range(8, sc.nights):  # from night 8 every detector has a baseline
        for row in sc.rows[n]:
            host, key = row["host"], row["case_key"]
            changed = (host, key) in sc.effect and n >= CHANGE_NIGHT
            if changed:
                continue
            band = band_of(sc.noise[key])
            checks[band] += 1
            f = found.get((host, key, n))
            if f is None or kind(f) != "regression":
                continue
            if status(f) == "confirmed":
                alarms[band] += 1
                noise_alarms[band] += (host, key, n) not in sc.outliers
            else:
                suspected[band] += 1
            if (host, key, n) in sc.outliers:
                outlier_flagged += 1
                outlier_confirmed += status(f) == "confirmed"
    recall, open_last, low_noise_5 = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0]), [0, 0]
    for (host, key), effect in sc.effect.items():
        want = "regression" if effect < 0 else "improvement"
        hits = [found.get((host, key, n)) for n in range(CHANGE_NIGHT, sc.nights)]
        hit = any(f is not None and kind(f) == want and status(f) == "confirmed" for f in hits)
        last = hits[-1]
        label = f"{effect * 100:+.0f} %"
        recall[label][0] += hit
        recall[label][1] += 1
        open_last[label][0] += last is not None and kind(last) == want and status(last) == "confirmed"
        open_last[label][1] += 1
        if effect == -0.05 and sc.noise[key] < 0.02:
            low_noise_5[0] += hit
            low_noise_5[1] += 1
    outlier_checks = sum(1 for h, k, n in sc.outliers if n >= 8 and not ((h, k) in sc.effect and n >= CHANGE_NIGHT))
    return {
        "checks": dict(checks),
        "false_alarms_per_1000": {b: round(1000 * alarms[b] / checks[b], 1) for b in checks},
        "noise_false_alarms_per_1000": {b: round(1000 * noise_alarms[b] / checks[b], 1) for b in checks},
        "suspected_per_1000": {b: round(1000 * suspected[b] / checks[b], 1) for b in checks},
        "outlier_nights": outlier_checks, "outliers_flagged": outlier_flagged, "outliers_confirmed": outlier_confirmed,
        "recall": {k: f"{v[0]}/{v[1]}" for k, v in sorted(recall.items())},
        "recall_frac": {k: v[0] / v[1] for k, v in recall.items()},
        "open_on_last_night": {k: f"{v[0]}/{v[1]}" for k, v in sorted(open_last.items())},
        "open_on_last_night_frac": {k: v[0] / v[1] for k, v in open_last.items()},
        "recall_5pct_under_2pct_noise": f"{low_noise_5[0]}/{low_noise_5[1]}",
        "recall_5pct_under_2pct_noise_frac": low_noise_5[0] / low_noise_5[1],
    }


def evaluate_compare(sc: Scenario, rows: list[dict]) -> dict:
    """Score `fleetbench compare` rows (one per host and case) against the truth: per effect, how many changed
    (host, case)s got the right verdict; a regression or improvement verdict on an unchanged (host, case), or
    one in the wrong direction, is a false verdict (-2 % is a real change: a verdict there is not false)."""
    right, false_verdicts, cant_tell = defaultdict(lambda: [0, 0]), 0, 0
    for r in rows:
        effect = sc.effect.get((r["host"], r["case_key"]))
        cant_tell += r["verdict"] == "not enough nights to tell"
        if effect is None:
            false_verdicts += r["verdict"] in ("regression", "improvement")
            continue
        want = "regression" if effect < 0 else "improvement"
        label = f"{effect * 100:+.0f} %"
        right[label][0] += r["verdict"] == want
        right[label][1] += 1
        false_verdicts += r["verdict"] == ("improvement" if effect < 0 else "regression")
    return {"right": {k: f"{v[0]}/{v[1]}" for k, v in sorted(right.items())},
            "right_frac": {k: v[0] / v[1] for k, v in right.items()}, "false_verdicts": false_verdicts,
            "not_enough_nights": cant_tell, "rows": len(rows)}


def night_date(n: int) -> str:
    return (NIGHT0 + timedelta(days=n)).date().isoformat()
