"""Regression detection, pure: each (host, case) of a run against its baseline (plain lists and dicts in and out).

The baseline of a result is the trailing window of earlier results of the same DAG, host, case and
image digest: the last `window` (default 7) results with status ok and an earlier logical date.
With fewer than `min_history` (default 3) of them there is no verdict ("insufficient history").

The metrics checked on a result (`metrics_of`) are its primary metric (benchmark_results `metric`
and `value`, in the direction its `better` names: images/sec or NCCL bus bandwidth higher, a
latency lower), then wall time, energy and cost (`SECONDARY`, lower). A metric regressed when,
against the baseline's values h_1..h_n,

    robust z = (x - median(h)) / s,  s = max(1.4826 x MAD(h), scale_floor_pct % x |median(h)|)

is at least `z_threshold` (default 3.5) in the bad direction AND the change against the median,
delta % = (x - median(h)) / |median(h)| x 100, is at least `min_effect_pct` (default 3 %) in the bad
direction. 1.4826 x MAD estimates the standard deviation of normal noise while one odd night in the
window does not move it; the floor keeps a history of identical values from giving an infinite z;
the minimum effect keeps a very quiet history from flagging changes nobody cares about. Severity is
"major" from `major_effect_pct` (default 10 %) on, else "minor". Improvements are not regressions.

The images/sec finding also carries a p-value: a two-sided Mann-Whitney U test (normal approximation
with tie and continuity corrections) between the run's step samples and the baseline runs' step
samples. It is reported, not used for the verdict: the step values of tf_cnn_benchmarks are running
means (autocorrelated), and pooling several nights mixes night-to-night noise into one sample, so
the test is optimistic; the night-level robust z carries the decision.

`fleetbench.regression.store` reads baselines from the warehouse and stores the findings;
`fleetbench.regression.compare` is the before/after report.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from fleetbench.config import RegressionSettings

log = logging.getLogger(__name__)

Row = Mapping[str, Any]  # a benchmark_results row as a dict

# The metrics checked on every result besides its primary metric -> the direction that is better. Column names
# of benchmark_results.
SECONDARY: dict[str, str] = {
    "duration_s": "lower",  # the case's wall time
    "energy_j": "lower",  # only when both sides measured it, or both estimated it
    "cost_usd": "lower",
}
SECONDARY_UNITS = {"duration_s": "s", "energy_j": "J", "cost_usd": "USD"}
# tf_cnn_benchmarks' primary metric, and the one of a row stored before rows named theirs (metric NULL).
LEGACY_PRIMARY = ("images_per_sec", "images/s", "higher")
METRICS: dict[str, str] = {LEGACY_PRIMARY[0]: LEGACY_PRIMARY[2], **SECONDARY}  # a tf_cnn_benchmarks row's metrics
MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD x 1.4826 estimates sigma of normal noise
ENERGY_SOURCES = ("measured", "estimated")
SEVERITIES = ("minor", "major")
# What "what changed" compares, besides the image digest and the GPU clocks.
CHANGE_FIELDS = ("driver_version", "cuda_driver_version", "gpu_model", "harness_revision")
CLOCK_CHANGE_PCT = 2.0  # a mean SM clock this much off the baseline's median is listed as a change


# -- which metrics a result has ------------------------------------------------------------------------
def primary_of(row: Row) -> tuple[str | None, str | None, str]:
    """(metric, unit, better) of a result's primary metric: the row's `metric`, `unit` and `better`; a row without
    them that has images/sec (stored before rows named their metric) is images/sec, higher is better."""
    if row.get("metric"):
        return row["metric"], row.get("unit"), "lower" if row.get("better") == "lower" else "higher"
    if row.get("images_per_sec") is not None:
        return LEGACY_PRIMARY
    return None, None, "higher"


def metrics_of(row: Row) -> list[tuple[str, str]]:
    """(metric, direction) of each metric checked on a result: its primary metric, then `SECONDARY` (a primary
    metric of the same name as a secondary one is the harness's, and replaces it)."""
    name, _, better = primary_of(row)
    head = [(name, better)] if name else []
    return head + [(m, d) for m, d in SECONDARY.items() if m != name]


def unit_of(row: Row, metric: str) -> str | None:
    """The unit of a result's metric: its primary metric's unit, or the secondary metric's."""
    name, unit, _ = primary_of(row)
    return unit if name == metric else SECONDARY_UNITS.get(metric)


def metric_value(row: Row, metric: str, unit: str | None = None) -> float | None:
    """A result's value of a metric: its `value` when the metric is its primary one (in `unit`, when given: a value
    in another unit is not comparable and counts as missing), else the column of that name (`SECONDARY`)."""
    name, row_unit, _ = primary_of(row)
    if name == metric:
        if unit is not None and row_unit is not None and row_unit != unit:
            return None
        return row.get("value") if row.get("metric") else row.get("images_per_sec")
    return row.get(metric) if metric in SECONDARY else None


# -- statistics -----------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    """The sample median (the mean of the two middle values for an even count)."""
    return float(statistics.median(values))


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation: median(|h_i - median(h)|), unscaled."""
    m = median(values)
    return median([abs(v - m) for v in values])


def robust_scale(history: Sequence[float], scale_floor_pct: float = 0.5) -> float:
    """s = max(1.4826 x MAD(h), scale_floor_pct / 100 x |median(h)|): a noise scale one outlier cannot inflate."""
    return max(MAD_TO_SIGMA * mad(history), scale_floor_pct / 100.0 * abs(median(history)))


def robust_z(value: float, history: Sequence[float], scale_floor_pct: float = 0.5) -> float | None:
    """z = (x - median(h)) / robust_scale(h); None when the scale is 0 (an all-zero history)."""
    scale = robust_scale(history, scale_floor_pct)
    if scale <= 0:
        return None
    return (value - median(history)) / scale


def delta_pct(value: float, baseline: float) -> float | None:
    """(x - b) / |b| x 100; None for b = 0."""
    if baseline == 0:
        return None
    return (value - baseline) / abs(baseline) * 100.0


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n of the values; tied values share the average of the ranks they span."""
    a = np.asarray(values, dtype=float)
    order = np.argsort(a, kind="mergesort")
    _, first, counts = np.unique(a[order], return_index=True, return_counts=True)
    ranks = np.empty(len(a), dtype=float)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return ranks


@dataclass(frozen=True)
class MannWhitney:
    """U of the first sample, the normal approximation's z (continuity-corrected) and the two-sided p-value."""

    u: float
    z: float
    p_value: float


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MannWhitney | None:
    """Two-sided Mann-Whitney U test of x against y, normal approximation with tie correction.

    Pool the samples (n = n_x + n_y), rank them (ties get the average rank), R_x = the sum of x's ranks:

        U_x = R_x - n_x (n_x + 1) / 2
        E[U] = n_x n_y / 2
        Var[U] = n_x n_y / 12 x ((n + 1) - sum(t^3 - t) / (n (n - 1)))   (t: the size of each group of ties)
        z = (|U_x - E[U]| - 1/2) / sqrt(Var[U])                            (continuity correction)
        p = erfc(z / sqrt 2) = 2 (1 - Phi(z))

    The approximation is good from about 8 values per sample on. None when a sample is empty;
    p = 1 when every value ties (Var[U] = 0).
    """
    xs = [float(v) for v in x if v is not None and math.isfinite(v)]
    ys = [float(v) for v in y if v is not None and math.isfinite(v)]
    nx, ny = len(xs), len(ys)
    if nx == 0 or ny == 0:
        return None
    n = nx + ny
    ranks = average_ranks(xs + ys)
    u = float(ranks[:nx].sum()) - nx * (nx + 1) / 2.0
    mean = nx * ny / 2.0
    _, counts = np.unique(np.asarray(xs + ys), return_counts=True)
    ties = float(np.sum(counts.astype(float) ** 3 - counts))
    var = nx * ny / 12.0 * ((n + 1) - (ties / (n * (n - 1)) if n > 1 else 0.0))
    if var <= 0:
        return MannWhitney(u=u, z=0.0, p_value=1.0)
    z = max(abs(u - mean) - 0.5, 0.0) / math.sqrt(var)
    return MannWhitney(u=u, z=math.copysign(z, u - mean), p_value=min(1.0, math.erfc(z / math.sqrt(2.0))))


# -- one metric against its history ---------------------------------------------------------------
@dataclass(frozen=True)
class MetricCheck:
    """One metric of one result against its baseline values.

    delta_pct and z_score are signed (x - median); `regression` / `improvement` apply the direction,
    the z threshold and the minimum effect; severity is set for regressions only.
    """

    metric: str
    direction: str
    value: float
    baseline_value: float
    baseline_n: int
    delta_pct: float
    z_score: float
    regression: bool
    improvement: bool
    severity: str | None


def severity_of(bad_delta_pct: float, settings: RegressionSettings) -> str:
    """"major" when the change in the bad direction is at least `major_effect_pct`, else "minor"."""
    return "major" if bad_delta_pct >= settings.major_effect_pct else "minor"


def check_metric(metric: str, value: float | None, history: Sequence[float | None],
                 settings: RegressionSettings | None = None, direction: str | None = None) -> MetricCheck | None:
    """The metric's value x against its baseline values h (robust z and delta %, see the module docstring).

    None (no verdict) when x is missing, fewer than `min_history` baseline values are there, or the
    baseline's median is not positive.
    """
    settings = settings or RegressionSettings()
    direction = direction or METRICS.get(metric, "higher")
    hist = [float(h) for h in history if h is not None and math.isfinite(h)]
    if value is None or not math.isfinite(value) or len(hist) < settings.min_history:
        return None
    base = median(hist)
    if base <= 0:
        return None
    z = robust_z(value, hist, settings.scale_floor_pct)
    d = delta_pct(value, base)
    if z is None or d is None:
        return None
    sign = -1.0 if direction == "higher" else 1.0  # bad direction: lower for "higher is better"
    bad_z, bad_d = sign * z, sign * d
    regression = bad_z >= settings.z_threshold and bad_d >= settings.min_effect_pct
    improvement = -bad_z >= settings.z_threshold and -bad_d >= settings.min_effect_pct
    return MetricCheck(metric=metric, direction=direction, value=float(value), baseline_value=base,
                       baseline_n=len(hist), delta_pct=d, z_score=z, regression=regression, improvement=improvement,
                       severity=severity_of(bad_d, settings) if regression else None)


# -- what changed ---------------------------------------------------------------------------------
def most_common(values: Iterable[Any]) -> Any:
    """The most frequent value; on a tie the one seen first (baseline rows come newest first). None when empty."""
    counts = Counter(values)
    if not counts:
        return None
    top = max(counts.values())
    return next(v for v in counts if counts[v] == top)


def sm_clock_mhz(row: Mapping[str, Any]) -> float | None:
    """Mean over the row's GPUs of the telemetry's mean SM clock (telemetry_json: gpus[].mean_sm_clock_mhz)."""
    raw = row.get("telemetry_json")
    if not raw:
        return None
    try:
        report = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    gpus = report.get("gpus") if isinstance(report, dict) else None
    clocks = [g["mean_sm_clock_mhz"] for g in gpus or []
              if isinstance(g, dict) and isinstance(g.get("mean_sm_clock_mhz"), (int, float))]
    return sum(clocks) / len(clocks) if clocks else None


def what_changed(row: Mapping[str, Any], baseline: Sequence[Mapping[str, Any]], previous_digest: str | None = None,
                 clock_change_pct: float = CLOCK_CHANGE_PCT) -> dict[str, dict]:
    """What differs between a result and its baseline: {field: {"before": ..., "after": ...}}.

    driver_version, cuda_driver_version, gpu_model: the baseline's most common value against the row's.
    image_digest: the baseline has the row's digest by construction, so it is listed when the latest
    earlier result of the case (any digest, `previous_digest`) had another one. gpu_sm_clock_mhz: the
    baseline's median mean SM clock against the row's, when both have telemetry and they differ by
    at least `clock_change_pct` %. host_gpu_health: the host's GPU health state (healthy, degraded,
    unfit) when both sides were checked and it differs.
    """
    changes: dict[str, dict] = {}
    for name in CHANGE_FIELDS:
        before = most_common(r.get(name) for r in baseline)
        if before != row.get(name):
            changes[name] = {"before": before, "after": row.get(name)}
    health = most_common(r.get("host_gpu_health") for r in baseline)
    if health and row.get("host_gpu_health") and health != row.get("host_gpu_health"):  # None: not checked
        changes["host_gpu_health"] = {"before": health, "after": row.get("host_gpu_health")}
    if previous_digest is not None and previous_digest != row.get("image_digest"):
        changes["image_digest"] = {"before": previous_digest, "after": row.get("image_digest")}
    now = sm_clock_mhz(row)
    clocks = [c for c in (sm_clock_mhz(r) for r in baseline) if c is not None]
    if now is not None and clocks:
        before = median(clocks)
        d = delta_pct(now, before)
        if d is not None and abs(d) >= clock_change_pct:
            changes["gpu_sm_clock_mhz"] = {"before": round(before, 1), "after": round(now, 1), "delta_pct": round(d, 2)}
    return changes


# -- one (host, case) against its baseline --------------------------------------------------------
def metric_history(metric: str, row: Row, baseline: Sequence[Row]) -> tuple[float | None, list[float]]:
    """The row's value of a metric and the baseline's values that are comparable with it (the same metric in the
    same unit).

    Energy compares like with like: only when the row's energy was measured or estimated, and only
    against baseline rows whose energy came the same way.
    """
    if metric == "energy_j":
        source = row.get("energy_source")
        if source not in ENERGY_SOURCES:
            return None, []
        return row.get("energy_j"), [r["energy_j"] for r in baseline
                                     if r.get("energy_source") == source and r.get("energy_j") is not None]
    unit = primary_of(row)[1] if metric not in SECONDARY else None
    values = (metric_value(r, metric, unit) for r in baseline)
    return metric_value(row, metric, unit), [v for v in values if v is not None]


def assess_case(row: Mapping[str, Any], baseline: Sequence[Mapping[str, Any]],
                settings: RegressionSettings | None = None) -> list[MetricCheck]:
    """Every metric of the row (`metrics_of`) the row and its baseline both have enough of, checked
    (`check_metric`)."""
    settings = settings or RegressionSettings()
    out = []
    for metric, direction in metrics_of(row):
        value, history = metric_history(metric, row, baseline)
        check = check_metric(metric, value, history, settings, direction)
        if check is not None:
            out.append(check)
    return out


def detect_case(row: Mapping[str, Any], baseline: Sequence[Mapping[str, Any]],
                settings: RegressionSettings | None = None, run_steps: Sequence[float] = (),
                baseline_steps: Sequence[float] = (), previous_digest: str | None = None,
                detected_at: str | None = None) -> list[dict]:
    """The regressions of one result against its baseline rows (newest first), as `regressions` rows.

    `run_steps` / `baseline_steps`: images/sec step samples of the row's run and of the baseline's
    runs, for the Mann-Whitney p-value of the images/sec finding. `baseline_window` is the list of
    the baseline's run ids, `changes` the `what_changed` dict (both JSON-encoded by `store_findings`).
    """
    settings = settings or RegressionSettings()
    return findings_of(row, baseline, assess_case(row, baseline, settings), run_steps, baseline_steps, previous_digest,
                       detected_at)


def findings_of(row: Mapping[str, Any], baseline: Sequence[Mapping[str, Any]], checks: Sequence[MetricCheck],
                run_steps: Sequence[float] = (), baseline_steps: Sequence[float] = (),
                previous_digest: str | None = None, detected_at: str | None = None) -> list[dict]:
    """`regressions` rows for the checks that are regressions (see `detect_case`)."""
    checks = [c for c in checks if c.regression]
    if not checks:
        return []
    changes = what_changed(row, baseline, previous_digest)
    detected_at = detected_at or datetime.now(timezone.utc).isoformat()
    findings = []
    for c in checks:
        p_value = None
        if c.metric == "images_per_sec":
            mw = mann_whitney_u(run_steps, baseline_steps)
            p_value = mw.p_value if mw else None
        findings.append({
            "dag_id": row["dag_id"], "run_id": row["run_id"], "host": row["host"], "case_key": row["case_key"],
            "metric": c.metric, "unit": unit_of(row, c.metric), "direction": c.direction,
            "baseline_value": c.baseline_value, "value": c.value,
            "delta_pct": c.delta_pct, "z_score": c.z_score, "p_value": p_value, "baseline_n": c.baseline_n,
            "baseline_window": [r["run_id"] for r in baseline], "changes": changes, "severity": c.severity,
            "detected_at": detected_at,
        })
    return findings


def describe(finding: Mapping[str, Any]) -> str:
    """One line for logs and mails:
    `host case: metric 100.0 -> 80.0 images/s (-20.0 %, z -12.3, major); driver_version 535 -> 550`."""
    changes = finding.get("changes") or {}
    if isinstance(changes, str):
        changes = json.loads(changes)
    what = ("; ".join(f"{k} {v.get('before')} -> {v.get('after')}" for k, v in changes.items())
            or "nothing recorded changed")
    z = finding.get("z_score")
    p = finding.get("p_value")
    unit = f" {finding['unit']}" if finding.get("unit") else ""
    return (f"{finding['host']} {finding['case_key']}: {finding['metric']} {finding['baseline_value']:.4g} -> "
            f"{finding['value']:.4g}{unit} ({finding['delta_pct']:+.1f} %" + (f", z {z:+.1f}" if z is not None else "")
            + (f", p {p:.2g}" if p is not None else "")
            + f", {finding['severity']}, baseline of {finding['baseline_n']} run(s)); changed: {what}")
