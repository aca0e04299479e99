"""The regression detector as pure functions, and its precision and recall on synthetic histories."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from fleetbench.config import ConfigError, RegressionSettings, parse_config
from fleetbench.regression.compare import compare_case, parse_side
from fleetbench.regression.detect import (
    MAD_TO_SIGMA,
    average_ranks,
    check_metric,
    describe,
    detect_case,
    mad,
    mann_whitney_u,
    median,
    robust_scale,
    robust_z,
    sm_clock_mhz,
    what_changed,
)

DIGEST = "sha256:" + "a" * 64
SETTINGS = RegressionSettings()


def row(run_id: str, ips: float | None = 100.0, **extra) -> dict:
    """A result row as the warehouse returns it (only what the detector reads)."""
    return {"dag_id": "fleet_benchmark", "run_id": run_id, "host": "h1", "case_key": "cnn.resnet50.bs64.g1",
            "status": "ok", "image_digest": DIGEST, "driver_version": "535.104.05", "cuda_driver_version": "12.2",
            "gpu_model": "NVIDIA A100-SXM4-40GB", "images_per_sec": ips, "duration_s": 60.0, "energy_source": "none",
            "energy_j": None, "cost_usd": 0.05, "telemetry_json": None, **extra}


def history(values, **extra) -> list[dict]:
    """Baseline rows, newest first (as the warehouse query returns them)."""
    return [row(f"r{i}", v, **extra) for i, v in enumerate(values)]


# -- statistics -----------------------------------------------------------------------------------
def test_median_mad_and_the_robust_scale():
    h = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0, 130.0]  # one odd night
    assert median(h) == 100.0
    assert mad(h) == 0.5  # |h - 100| = 0, 1, 1, .5, .5, 0, 30 -> median 0.5: the odd night does not count
    assert robust_scale(h) == pytest.approx(MAD_TO_SIGMA * 0.5)
    assert robust_z(95.0, h) == pytest.approx(-5.0 / (MAD_TO_SIGMA * 0.5))


def test_identical_history_gets_the_scale_floor_not_an_infinite_z():
    h = [200.0] * 7
    assert robust_scale(h, scale_floor_pct=0.5) == 1.0  # 0.5 % of 200
    assert robust_z(197.0, h, scale_floor_pct=0.5) == -3.0
    assert robust_z(1.0, [0.0] * 5) is None  # no scale at all: no z


def test_average_ranks_share_ties():
    assert average_ranks([30, 10, 20, 20]).tolist() == [4.0, 1.0, 2.5, 2.5]
    assert average_ranks([5, 5, 5]).tolist() == [2.0, 2.0, 2.0]


def test_mann_whitney_by_hand():
    # x entirely below y: U_x = 0, E[U] = 12.5, Var[U] = 5 x 5 / 12 x 11 = 22.9167, z = (12.5 - 0.5) / 4.787 = 2.507.
    mw = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert mw.u == 0.0
    assert mw.z == pytest.approx(-12.0 / math.sqrt(25 / 12 * 11))
    assert mw.p_value == pytest.approx(math.erfc(12.0 / math.sqrt(25 / 12 * 11) / math.sqrt(2)))
    assert mw.p_value == pytest.approx(0.01219, abs=1e-4)
    # Ties: x = [1, 2, 2], y = [2, 3]: ranks 1, 3, 3 | 3, 5; U_x = 7 - 6 = 1; ties sum(t^3 - t) = 24;
    # Var = 3 x 2 / 12 x (6 - 24 / 20) = 2.4; z = (|1 - 3| - 0.5) / sqrt(2.4).
    mw = mann_whitney_u([1, 2, 2], [2, 3])
    assert mw.u == 1.0
    assert abs(mw.z) == pytest.approx(1.5 / math.sqrt(2.4))
    assert mann_whitney_u([7.0] * 4, [7.0] * 6).p_value == 1.0
    assert mann_whitney_u([], [1.0]) is None


def test_mann_whitney_normal_approximation_is_close_to_the_exact_permutation_p_value():
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 1.0, 7).round(3).tolist()
    y = rng.normal(1.2, 1.0, 8).round(3).tolist()
    pooled, nx = x + y, len(x)
    ranks = average_ranks(pooled)
    u_obs = ranks[:nx].sum() - nx * (nx + 1) / 2
    mean = nx * len(y) / 2
    us = [ranks[list(idx)].sum() - nx * (nx + 1) / 2 for idx in itertools.combinations(range(len(pooled)), nx)]
    exact = sum(1 for u in us if abs(u - mean) >= abs(u_obs - mean) - 1e-9) / len(us)
    approx = mann_whitney_u(x, y).p_value
    assert exact < 0.05
    assert approx == pytest.approx(exact, abs=0.01)


# -- one metric -----------------------------------------------------------------------------------
QUIET = [100.0, 100.4, 99.7, 100.2, 99.9, 100.1, 99.8]


def test_throughput_drop_on_a_quiet_history_is_a_major_regression():
    c = check_metric("images_per_sec", 80.0, QUIET, SETTINGS)
    assert c.regression and not c.improvement
    assert (c.direction, c.baseline_value, c.baseline_n, c.severity) == ("higher", 100.0, 7, "major")
    assert c.delta_pct == pytest.approx(-20.0)
    assert c.z_score < -SETTINGS.z_threshold


def test_direction_per_metric():
    # Lower is better for time, energy and cost: a rise is the regression, a fall the improvement.
    slower = check_metric("duration_s", 64.2, [60.0, 60.2, 59.8, 60.1, 59.9], SETTINGS)
    assert slower.regression and slower.direction == "lower" and slower.severity == "minor"  # +7 %
    assert check_metric("duration_s", 66.0, [60.0, 60.2, 59.8, 60.1, 59.9], SETTINGS).severity == "major"  # +10 %
    faster = check_metric("duration_s", 50.0, [60.0, 60.2, 59.8, 60.1, 59.9], SETTINGS)
    assert faster.improvement and not faster.regression and faster.severity is None
    more_throughput = check_metric("images_per_sec", 125.0, QUIET, SETTINGS)
    assert more_throughput.improvement and not more_throughput.regression
    assert check_metric("cost_usd", 0.06, [0.05] * 5, SETTINGS).regression
    assert check_metric("energy_j", 900.0, [1000.0] * 5, SETTINGS).improvement


def test_a_significant_but_tiny_change_is_not_a_regression():
    c = check_metric("images_per_sec", 98.0, [100.0] * 7, SETTINGS)  # z = -4 (floor scale 0.5), but only -2 %
    assert c.z_score == pytest.approx(-4.0)
    assert not c.regression


def test_a_big_change_inside_a_noisy_history_is_not_a_regression():
    noisy = [100.0, 112.0, 91.0, 104.0, 95.0, 108.0, 89.0]  # MAD 8: s = 11.9
    c = check_metric("images_per_sec", 85.0, noisy, SETTINGS)
    assert c.delta_pct == pytest.approx(-15.0, abs=0.1)
    assert abs(c.z_score) < SETTINGS.z_threshold and not c.regression


def test_one_bad_night_in_the_baseline_does_not_hide_a_regression():
    with_outlier = QUIET[:6] + [60.0]  # a mean/stdev z would be about -0.5 here
    values = np.asarray(with_outlier)
    assert abs((85.0 - values.mean()) / values.std(ddof=1)) < 1.0
    c = check_metric("images_per_sec", 85.0, with_outlier, SETTINGS)
    assert c.regression and c.baseline_value == pytest.approx(100.0, abs=0.2)


def test_no_verdict_without_enough_history_or_a_value():
    assert check_metric("images_per_sec", 50.0, [100.0, 100.0], SETTINGS) is None  # min_history 3
    assert check_metric("images_per_sec", 50.0, [100.0, None, 100.0, None], SETTINGS) is None
    assert check_metric("images_per_sec", None, QUIET, SETTINGS) is None
    assert check_metric("images_per_sec", 50.0, [100.0, 100.0], RegressionSettings(min_history=2)).regression


# -- what changed ---------------------------------------------------------------------------------
def telemetry(*clocks) -> str:
    return json.dumps({"nvml": True, "gpus": [{"index": i, "mean_sm_clock_mhz": c} for i, c in enumerate(clocks)]})


def test_sm_clock_is_the_mean_over_gpus():
    assert sm_clock_mhz(row("r", telemetry_json=telemetry(1400.0, 1410.0))) == 1405.0
    assert sm_clock_mhz(row("r", telemetry_json=json.dumps({"nvml": False}))) is None
    assert sm_clock_mhz(row("r", telemetry_json="not json")) is None


def test_what_changed_names_driver_image_and_clocks():
    base = history([100.0] * 5, telemetry_json=telemetry(1410.0))
    base[0]["driver_version"] = "550.54.14"  # one odd night does not make the most common value
    now = row("now", 80.0, driver_version="550.54.14", telemetry_json=telemetry(1200.0))
    changes = what_changed(now, base, previous_digest="sha256:" + "b" * 64)
    assert changes["driver_version"] == {"before": "535.104.05", "after": "550.54.14"}
    assert changes["image_digest"] == {"before": "sha256:" + "b" * 64, "after": DIGEST}
    assert changes["gpu_sm_clock_mhz"] == {"before": 1410.0, "after": 1200.0,
                                           "delta_pct": pytest.approx(-14.89, abs=0.01)}
    assert "cuda_driver_version" not in changes and "gpu_model" not in changes
    assert what_changed(row("now", telemetry_json=telemetry(1405.0)), base, previous_digest=DIGEST) == {}


# -- one case -------------------------------------------------------------------------------------
def test_detect_case_gives_regressions_rows_with_window_changes_and_p_value():
    base = history(QUIET)
    now = row("now", 80.0, duration_s=75.0, driver_version="550.54.14")
    found = detect_case(now, base, SETTINGS, run_steps=[80.0 + i * 0.1 for i in range(10)],
                        baseline_steps=[100.0 + i * 0.1 for i in range(70)], detected_at="2026-12-08T02:30:00+00:00")
    by_metric = {f["metric"]: f for f in found}
    assert set(by_metric) == {"images_per_sec", "duration_s"}  # cost unchanged, energy not measured
    ips = by_metric["images_per_sec"]
    assert (ips["direction"], ips["severity"], ips["baseline_n"]) == ("higher", "major", 7)
    assert ips["baseline_window"] == [f"r{i}" for i in range(7)]
    assert ips["changes"] == {"driver_version": {"before": "535.104.05", "after": "550.54.14"}}
    assert ips["p_value"] < 1e-6
    assert by_metric["duration_s"]["p_value"] is None and by_metric["duration_s"]["delta_pct"] == pytest.approx(25.0)
    assert "driver_version 535.104.05 -> 550.54.14" in describe(ips) and "-20.0 %" in describe(ips)
    assert detect_case(row("same", 100.1), base, SETTINGS) == []


def test_energy_is_compared_only_like_with_like():
    measured = history([100.0] * 5, energy_source="measured", energy_j=1000.0)
    estimated = history([100.0] * 5, energy_source="estimated", energy_j=600.0)
    now = row("now", 100.0, energy_source="measured", energy_j=1300.0)
    assert [f["metric"] for f in detect_case(now, measured, SETTINGS)] == ["energy_j"]
    assert detect_case(now, estimated, SETTINGS) == []  # measured vs estimated: no verdict
    assert detect_case(row("now", 100.0, energy_source="none"), measured, SETTINGS) == []


# -- compare report (pure part) -------------------------------------------------------------------
def test_compare_case_with_and_without_enough_runs_before():
    before = history(QUIET, energy_source="measured", energy_j=1000.0, cost_usd=0.05)
    after = history([90.0, 90.5], energy_source="measured", energy_j=1100.0, cost_usd=0.055, driver_version="550.54.14")
    r = compare_case(before, after, SETTINGS, before_steps=[100.0] * 30, after_steps=[90.0] * 20)
    assert ((r["verdict"], r["basis"], r["severity"], r["before_n"], r["after_n"])
            == ("regression", "runs", "minor", 7, 2))
    assert r["delta_pct"] == pytest.approx(-9.75)
    assert r["energy_delta_pct"] == pytest.approx(10.0) and r["cost_delta_pct"] == pytest.approx(10.0)
    assert ((r["before_driver_version"], r["after_driver_version"], r["image_changed"])
            == ("535.104.05", "550.54.14", False))
    # One night each side: the step samples decide.
    one = compare_case(before[:1], after[:1], SETTINGS, before_steps=[100.0 + i * 0.01 for i in range(20)],
                       after_steps=[90.0 + i * 0.01 for i in range(20)])
    assert (one["verdict"], one["basis"], one["z_score"], one["delta_pct"]) == ("regression", "steps", None, -10.0)
    assert one["p_value"] < 0.01
    flat = compare_case(after[:1], history([91.0]), SETTINGS, before_steps=[90.0 + i * 0.1 for i in range(20)],
                        after_steps=[90.05 + i * 0.1 for i in range(20)])
    assert (flat["verdict"], flat["basis"]) == ("no change", "steps") and flat["p_value"] > 0.5
    none = compare_case(before[:1], after[:1], SETTINGS)
    assert none["verdict"] == "insufficient history" and none["p_value"] is None


def test_compare_sides_are_a_driver_or_a_date():
    assert parse_side("535.104.05") == ("driver", "535.104.05")
    assert parse_side("2026-12-01")[0] == "date"
    with pytest.raises(ValueError, match="not a date"):
        parse_side("2026-13-45")


def test_settings_are_part_of_the_fleet_config_with_field_paths():
    base = {"hosts": [{"name": "h"}], "images": [{"name": "i", "ref": "127.0.0.1:5000/x:1", "command": ["python3"]}],
            "benchmarks": [{"name": "b", "image": "i", "models": ["m"], "batch_sizes": [1]}]}
    cfg = parse_config({**base, "fleet": {"regressions": {"window": 14, "z_threshold": 4},
                                          "notify": {"smtp_conn_id": "smtp_ops", "to": ["gpu-team@example.org"]}}})
    assert (cfg.fleet.regressions.window, cfg.fleet.regressions.min_history) == (14, 3)
    assert cfg.fleet.notify.to == ["gpu-team@example.org"] and cfg.fleet.notify.min_severity == "minor"
    assert parse_config(base).fleet.notify is None
    with pytest.raises(ConfigError) as err:
        parse_config({**base, "fleet": {"regressions": {"window": 2},
                                        "notify": {"smtp_conn_id": "smtp ops", "to": ["nobody"],
                                                   "min_severity": "all"}}})
    text = "\n".join(err.value.errors)
    assert "fleet.regressions: min_history (3) must be <= window (2)" in text
    assert "fleet.notify.smtp_conn_id: must match" in text
    assert "fleet.notify.to[0]: must match" in text and "'nobody'" in text
    assert "fleet.notify.min_severity: must be one of 'minor' or 'major'" in text


# -- the synthetic evaluation ---------------------------------------------------------------------
SEED = 20261202
HISTORIES = 300
NIGHTS = 8  # 7 baseline nights and the night checked
STEPS = 20
NIGHT_CV = (0.005, 0.01, 0.02, 0.03)  # night-to-night noise (coefficient of variation)
STEP_CV = (0.01, 0.03)  # step-to-step noise within a night
EFFECTS = (0.05, 0.10, 0.20, 0.30)
EVALUATED = ("images_per_sec", "duration_s")


def synthetic_history(rng: np.random.Generator, i: int) -> dict:
    """One (host, case) history with known truth.

    Per night k: true throughput mu (1 + e_k), e_k ~ N(0, night_cv); STEPS step samples around it with
    step_cv; the night's images/sec is the mean of its steps; wall time d (1 + N(0, night_cv)).
    One in ten histories has a bad baseline night (-20 % throughput, +25 % time). Half the
    histories stay clean; a third get a regression, a sixth an improvement, of one of EFFECTS,
    injected into the checked night's throughput or wall time (alternating).
    """
    night_cv, step_cv = NIGHT_CV[i % len(NIGHT_CV)], STEP_CV[(i // len(NIGHT_CV)) % len(STEP_CV)]
    mu = float(np.exp(rng.uniform(np.log(50.0), np.log(5000.0))))
    d0 = float(rng.uniform(60.0, 600.0))
    kind = rng.choice(["clean", "regression", "improvement"], p=[1 / 2, 1 / 3, 1 / 6])
    effect = float(rng.choice(EFFECTS))
    target = EVALUATED[i % 2]
    steps, rows = [], []
    bad_night = int(rng.integers(1, NIGHTS)) if rng.random() < 0.1 else None  # never the checked night (0)
    for k in range(NIGHTS):  # k = 0 is the night checked, 1..7 its baseline, newest first
        m = mu * (1 + rng.normal(0.0, night_cv))
        d = d0 * (1 + rng.normal(0.0, night_cv))
        if k == bad_night:
            m, d = m * 0.8, d * 1.25
        if k == 0 and kind != "clean":
            worse = kind == "regression"
            if target == "images_per_sec":
                m *= (1 - effect) if worse else (1 + effect)
            else:
                d *= (1 + effect) if worse else (1 - effect)
        s = (m * (1 + rng.normal(0.0, step_cv, STEPS))).tolist()
        steps.append(s)
        rows.append(row(f"h{i}n{k}", float(np.mean(s)), duration_s=d, cost_usd=None))
    truth = {metric: (str(kind) if metric == target else "clean", effect) for metric in EVALUATED}
    return {"now": rows[0], "baseline": rows[1:], "run_steps": steps[0],
            "baseline_steps": [v for s in steps[1:] for v in s], "truth": truth, "night_cv": night_cv}


def evaluate(histories: list[dict]) -> dict:
    """Confusion counts over (history, metric) units: a positive is an injected regression of that metric."""
    tp = fp = fn = 0
    by_effect, by_noise = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    flagged_improvements = 0
    negatives = Counter()
    p_values = []
    for h in histories:
        found = {f["metric"]: f
                 for f in detect_case(h["now"], h["baseline"], SETTINGS, h["run_steps"], h["baseline_steps"])}
        for metric, (kind, effect) in h["truth"].items():
            hit = metric in found
            if kind == "regression":
                tp, fn = tp + hit, fn + (not hit)
                by_effect[effect][0] += hit
                by_effect[effect][1] += 1
                if effect >= 0.10:
                    by_noise[h["night_cv"]][0] += hit
                    by_noise[h["night_cv"]][1] += 1
                if hit and metric == "images_per_sec":
                    p_values.append(found[metric]["p_value"])
            else:
                fp += hit
                negatives[kind] += 1
                flagged_improvements += hit and kind == "improvement"
    big = [by_effect[e] for e in EFFECTS if e >= 0.10]
    return {"tp": tp, "fp": fp, "fn": fn, "precision": tp / (tp + fp), "recall": tp / (tp + fn),
            "recall_by_effect": {e: by_effect[e][0] / by_effect[e][1] for e in EFFECTS},
            "n_by_effect": {e: by_effect[e][1] for e in EFFECTS},
            "recall_10pct_up": sum(h for h, _ in big) / sum(n for _, n in big),
            "recall_by_noise": {cv: by_noise[cv][0] / by_noise[cv][1] for cv in NIGHT_CV},
            "negatives": dict(negatives), "false_positive_rate": fp / sum(negatives.values()),
            "flagged_improvements": flagged_improvements, "p_values": p_values}


def test_detector_precision_and_recall_on_synthetic_histories():
    rng = np.random.default_rng(SEED)
    result = evaluate([synthetic_history(rng, i) for i in range(HISTORIES)])
    print()
    print(f"regression detector on {HISTORIES} synthetic histories "
          f"({HISTORIES * len(EVALUATED)} history x metric units; "
          f"seed {SEED}; window 7, z >= {SETTINGS.z_threshold}, effect >= {SETTINGS.min_effect_pct} %)")
    print(f"  precision {result['precision']:.3f} (TP {result['tp']}, FP {result['fp']}), "
          f"recall {result['recall']:.3f} "
          f"(FN {result['fn']}); recall for effects >= 10 %: {result['recall_10pct_up']:.3f}")
    print("  recall by injected effect: " + ", ".join(
        f"{e:.0%}: {r:.2f} (n={result['n_by_effect'][e]})" for e, r in result["recall_by_effect"].items()))
    print("  recall for effects >= 10 % by night-to-night noise: " + ", ".join(
        f"{cv:.1%}: {r:.2f}" for cv, r in result["recall_by_noise"].items()))
    print(f"  false positive rate {result['false_positive_rate']:.3f} over {result['negatives']} negative units; "
          f"improvements flagged: {result['flagged_improvements']}")
    assert result["precision"] >= 0.9
    assert result["recall_10pct_up"] >= 0.8
    assert result["recall_by_effect"][0.20] >= 0.9 and result["recall_by_effect"][0.30] >= 0.95
    assert result["flagged_improvements"] == 0  # direction-aware: getting better is never a regression
    assert result["false_positive_rate"] <= 0.05
    # Every throughput finding carries its step-level p-value, and the injected drops are far from chance.
    assert result["p_values"] and all(p is not None and p < 0.01 for p in result["p_values"])
