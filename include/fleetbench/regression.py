"""Regression detection: each (host, case) of a run against its baseline, and the before/after report.

The baseline of a result is the trailing window of earlier results of the same DAG, host, case and
image digest: the last `window` (default 7) results with status ok and an earlier logical date.
With fewer than `min_history` (default 3) of them there is no verdict ("insufficient history").

Each metric has a direction, the way that is better (`METRICS`): images/sec higher; wall time,
energy and cost lower. A metric regressed when, against the baseline's values h_1..h_n,

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

Everything above the "warehouse" line is pure (plain lists and dicts in, plain dicts out); the
functions below it read and write the warehouse.
"""

from __future__ import annotations

import json
import logging
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from fleetbench.config import RegressionSettings

log = logging.getLogger(__name__)

Row = Mapping[str, Any]  # a benchmark_results row as a dict

# metric -> the direction that is better. Column names of benchmark_results.
METRICS: dict[str, str] = {
    "images_per_sec": "higher",  # throughput
    "duration_s": "lower",  # the case's wall time
    "energy_j": "lower",  # only when both sides measured it, or both estimated it
    "cost_usd": "lower",
}
MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD x 1.4826 estimates sigma of normal noise
ENERGY_SOURCES = ("measured", "estimated")
SEVERITIES = ("minor", "major")
# What "what changed" compares, besides the image digest and the GPU clocks.
CHANGE_FIELDS = ("driver_version", "cuda_driver_version", "gpu_model")
CLOCK_CHANGE_PCT = 2.0  # a mean SM clock this much off the baseline's median is listed as a change


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
    direction = direction or METRICS[metric]
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
    return MetricCheck(metric=metric, direction=direction, value=float(value), baseline_value=base, baseline_n=len(hist),
                       delta_pct=d, z_score=z, regression=regression, improvement=improvement,
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
    at least `clock_change_pct` %.
    """
    changes: dict[str, dict] = {}
    for name in CHANGE_FIELDS:
        before = most_common(r.get(name) for r in baseline)
        if before != row.get(name):
            changes[name] = {"before": before, "after": row.get(name)}
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
    """The row's value of a metric and the baseline's values that are comparable with it.

    Energy compares like with like: only when the row's energy was measured or estimated, and only
    against baseline rows whose energy came the same way.
    """
    if metric == "energy_j":
        source = row.get("energy_source")
        if source not in ENERGY_SOURCES:
            return None, []
        return row.get("energy_j"), [r["energy_j"] for r in baseline
                                     if r.get("energy_source") == source and r.get("energy_j") is not None]
    return row.get(metric), [r[metric] for r in baseline if r.get(metric) is not None]


def assess_case(row: Mapping[str, Any], baseline: Sequence[Mapping[str, Any]],
                settings: RegressionSettings | None = None) -> list[MetricCheck]:
    """Every metric of `METRICS` the row and its baseline both have enough of, checked (`check_metric`)."""
    settings = settings or RegressionSettings()
    out = []
    for metric, direction in METRICS.items():
        value, history = metric_history(metric, row, baseline)
        check = check_metric(metric, value, history, settings, direction)
        if check is not None:
            out.append(check)
    return out


def detect_case(row: Mapping[str, Any], baseline: Sequence[Mapping[str, Any]], settings: RegressionSettings | None = None,
                run_steps: Sequence[float] = (), baseline_steps: Sequence[float] = (), previous_digest: str | None = None,
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
                run_steps: Sequence[float] = (), baseline_steps: Sequence[float] = (), previous_digest: str | None = None,
                detected_at: str | None = None) -> list[dict]:
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
            "metric": c.metric, "direction": c.direction, "baseline_value": c.baseline_value, "value": c.value,
            "delta_pct": c.delta_pct, "z_score": c.z_score, "p_value": p_value, "baseline_n": c.baseline_n,
            "baseline_window": [r["run_id"] for r in baseline], "changes": changes, "severity": c.severity,
            "detected_at": detected_at,
        })
    return findings


def describe(finding: Mapping[str, Any]) -> str:
    """One line for logs and mails: `host case: metric 100.0 -> 80.0 (-20.0 %, z -12.3, major); driver_version 535 -> 550`."""
    changes = finding.get("changes") or {}
    if isinstance(changes, str):
        changes = json.loads(changes)
    what = "; ".join(f"{k} {v.get('before')} -> {v.get('after')}" for k, v in changes.items()) or "nothing recorded changed"
    z = finding.get("z_score")
    p = finding.get("p_value")
    return (f"{finding['host']} {finding['case_key']}: {finding['metric']} {finding['baseline_value']:.4g} -> "
            f"{finding['value']:.4g} ({finding['delta_pct']:+.1f} %" + (f", z {z:+.1f}" if z is not None else "")
            + (f", p {p:.2g}" if p is not None else "")
            + f", {finding['severity']}, baseline of {finding['baseline_n']} run(s)); changed: {what}")


# -- before / after report ------------------------------------------------------------------------
def _medians(rows: Sequence[Mapping[str, Any]], column: str) -> float | None:
    values = [r[column] for r in rows if r.get(column) is not None]
    return median(values) if values else None


def _energy_pair(before: Sequence[Row], after: Sequence[Row]) -> tuple[float | None, float | None, str | None]:
    """Median energy of each side from one common source (measured preferred to estimated), else Nones."""
    for source in ENERGY_SOURCES:
        b = [r["energy_j"] for r in before if r.get("energy_source") == source and r.get("energy_j") is not None]
        a = [r["energy_j"] for r in after if r.get("energy_source") == source and r.get("energy_j") is not None]
        if b and a:
            return median(b), median(a), source
    return None, None, None


def _pct(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else delta_pct(after, before)


def compare_case(before: Sequence[Row], after: Sequence[Row], settings: RegressionSettings | None = None,
                 before_steps: Sequence[float] = (), after_steps: Sequence[float] = (), alpha: float = 0.01) -> dict:
    """One (host, case) before and after: medians of each side, deltas, significance and a verdict.

    Throughput: x = the after side's median images/sec against the before side's per-run values,
    robust z and delta % as in detection (`check_metric`); with fewer than `min_history` runs before,
    the verdict falls back to the Mann-Whitney test of the step samples (p < `alpha`, still with the
    minimum effect), basis "steps", else "insufficient history". Energy (one common source) and
    cost: deltas of the medians.
    """
    settings = settings or RegressionSettings()
    b_ips = [r["images_per_sec"] for r in before if r.get("images_per_sec") is not None]
    a_ips = [r["images_per_sec"] for r in after if r.get("images_per_sec") is not None]
    b_med = median(b_ips) if b_ips else None
    a_med = median(a_ips) if a_ips else None
    check = check_metric("images_per_sec", a_med, b_ips, settings) if a_med is not None else None
    mw = mann_whitney_u(after_steps, before_steps)
    d = _pct(a_med, b_med)
    if check is not None:
        basis = "runs"
        verdict = "regression" if check.regression else "improvement" if check.improvement else "no change"
    elif mw is not None and d is not None:
        basis = "steps"
        big = abs(d) >= settings.min_effect_pct and mw.p_value < alpha
        verdict = ("regression" if d < 0 else "improvement") if big else "no change"
    else:
        basis, verdict = None, "insufficient history"
    e_before, e_after, e_source = _energy_pair(before, after)
    c_before, c_after = _medians(before, "cost_usd"), _medians(after, "cost_usd")
    first = (after or before)[0]
    return {
        "host": first["host"], "case_key": first["case_key"],
        "before_n": len(b_ips), "after_n": len(a_ips),
        "before_images_per_sec": b_med, "after_images_per_sec": a_med, "delta_pct": d,
        "z_score": check.z_score if check else None, "p_value": mw.p_value if mw else None,
        "basis": basis, "verdict": verdict,
        "significant": verdict in ("regression", "improvement"),
        "severity": severity_of(-d, settings) if verdict == "regression" and d is not None else None,
        "energy_source": e_source, "before_energy_j": e_before, "after_energy_j": e_after,
        "energy_delta_pct": _pct(e_after, e_before),
        "before_cost_usd": c_before, "after_cost_usd": c_after, "cost_delta_pct": _pct(c_after, c_before),
        "before_driver_version": most_common(r.get("driver_version") for r in before),
        "after_driver_version": most_common(r.get("driver_version") for r in after),
        "image_changed": {r.get("image_digest") for r in before} != {r.get("image_digest") for r in after},
    }


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


COMPARE_TABLE = ("host", "case", "before img/s (n)", "after img/s (n)", "delta %", "z", "p", "verdict", "energy %", "cost %")


def format_compare(rows: Sequence[Mapping[str, Any]]) -> str:
    """The compare report as a text table (one line per host and case)."""
    cells = [list(COMPARE_TABLE)]
    for r in rows:
        verdict = (r["verdict"] + (f" ({r['severity']})" if r.get("severity") else "")
                   + (" [steps]" if r.get("basis") == "steps" else ""))
        cells.append([
            r["host"], r["case_key"],
            f"{_num(r['before_images_per_sec'], '.2f')} ({r['before_n']})",
            f"{_num(r['after_images_per_sec'], '.2f')} ({r['after_n']})",
            _num(r["delta_pct"], "+.1f"), _num(r["z_score"], "+.1f"), _num(r["p_value"], ".2g"), verdict,
            _num(r["energy_delta_pct"], "+.1f"), _num(r["cost_delta_pct"], "+.1f"),
        ])
    widths = [max(len(c[i]) for c in cells) for i in range(len(COMPARE_TABLE))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# == warehouse ====================================================================================
class NoResults(LookupError):
    """A compare side that matches no ok result (an unknown driver version or a date without runs)."""


@dataclass
class RunAssessment:
    """What `assess_run` found for one run: the regressions, and how many cases had a verdict or too little history."""

    findings: list[dict] = field(default_factory=list)
    checked: int = 0
    insufficient_history: list[str] = field(default_factory=list)  # "host case_key"
    improvements: list[dict] = field(default_factory=list)


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _digest_is(column, digest: str | None):
    return column.is_(None) if digest is None else column == digest


def assess_run(engine, dag_id: str, run_id: str, settings: RegressionSettings | None = None) -> RunAssessment:
    """Check every ok result of one run against its baseline (see the module docstring); reads only."""
    from sqlalchemy import and_, select

    from fleetbench.warehouse.schema import benchmark_results as br
    from fleetbench.warehouse.schema import steps

    settings = settings or RegressionSettings()
    out = RunAssessment()
    detected_at = datetime.now(timezone.utc).isoformat()
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(
            select(br).where(br.c.dag_id == dag_id, br.c.run_id == run_id, br.c.status == "ok")
            .order_by(br.c.host, br.c.case_key))]
        for row in rows:
            label = f"{row['host']} {row['case_key']}"
            when = _aware(row["logical_date"])
            if when is None:
                log.warning("%s: no logical date on the result, no baseline", label)
                out.insufficient_history.append(label)
                continue
            same_case = and_(br.c.dag_id == dag_id, br.c.host == row["host"], br.c.case_key == row["case_key"],
                             br.c.logical_date < when)
            baseline = [dict(r._mapping) for r in conn.execute(
                select(br).where(same_case, br.c.status == "ok", _digest_is(br.c.image_digest, row["image_digest"]))
                .order_by(br.c.logical_date.desc(), br.c.run_id.desc()).limit(settings.window))]
            if len(baseline) < settings.min_history:
                log.info("%s: insufficient history (%d earlier ok result(s) with image digest %s, need %d)",
                         label, len(baseline), row["image_digest"], settings.min_history)
                out.insufficient_history.append(label)
                continue
            out.checked += 1
            previous = conn.execute(select(br.c.image_digest).where(same_case, br.c.image_digest.is_not(None))
                                    .order_by(br.c.logical_date.desc(), br.c.run_id.desc()).limit(1)).scalar()
            run_ids = [row["run_id"]] + [b["run_id"] for b in baseline]
            samples = conn.execute(select(steps.c.run_id, steps.c.images_per_sec).where(
                steps.c.dag_id == dag_id, steps.c.host == row["host"], steps.c.case_key == row["case_key"],
                steps.c.run_id.in_(run_ids))).all()
            run_steps = [v for r, v in samples if r == row["run_id"] and v is not None]
            base_steps = [v for r, v in samples if r != row["run_id"] and v is not None]
            checks = assess_case(row, baseline, settings)
            out.findings += findings_of(row, baseline, checks, run_steps, base_steps, previous, detected_at)
            out.improvements += [{"host": row["host"], "case_key": row["case_key"], "metric": c.metric,
                                  "delta_pct": c.delta_pct, "z_score": c.z_score} for c in checks if c.improvement]
    return out


def detect_for_run(engine, dag_id: str, run_id: str, settings: RegressionSettings | None = None) -> list[dict]:
    """The regressions of one run (`regressions` rows as dicts; `changes` and `baseline_window` not yet JSON)."""
    return assess_run(engine, dag_id, run_id, settings).findings


def _db_row(finding: Mapping[str, Any]) -> dict:
    from fleetbench.warehouse.schema import regressions

    row = {c.name: finding.get(c.name) for c in regressions.columns if c.name != "id"}
    for name in ("baseline_window", "changes"):
        if row[name] is not None and not isinstance(row[name], str):
            row[name] = json.dumps(row[name], sort_keys=True)
    row["detected_at"] = _aware(row["detected_at"]) or datetime.now(timezone.utc)
    return row


def store_findings(engine, dag_id: str, run_id: str, findings: Sequence[Mapping[str, Any]]) -> int:
    """Make the run's `regressions` rows exactly `findings`, in one transaction; returns the rows written.

    Upserted on (dag_id, run_id, host, case_key, metric), so detecting again is idempotent; the run's
    rows that are not findings any more (a rerun that recovered) are deleted.
    """
    from sqlalchemy import and_, delete, not_, tuple_

    from fleetbench.warehouse import _upsert
    from fleetbench.warehouse.schema import REGRESSION_KEY, regressions

    rows = sorted((_db_row(f) for f in findings), key=lambda r: tuple(str(r[k]) for k in REGRESSION_KEY))
    if any((r["dag_id"], r["run_id"]) != (dag_id, run_id) for r in rows):
        raise ValueError(f"findings of another run than {dag_id}/{run_id}")
    keep = [(r["host"], r["case_key"], r["metric"]) for r in rows]
    stale = and_(regressions.c.dag_id == dag_id, regressions.c.run_id == run_id)
    if keep:
        stale = and_(stale, not_(tuple_(regressions.c.host, regressions.c.case_key, regressions.c.metric).in_(keep)))
    with engine.begin() as conn:
        conn.execute(delete(regressions).where(stale))
        _upsert(conn, regressions, rows, REGRESSION_KEY)
    return len(rows)


def fetch_regressions(engine, dag_id: str | None = None, run_id: str | None = None) -> list[dict]:
    """Rows of `regressions` (optionally one DAG's / run's), `changes` and `baseline_window` decoded."""
    from sqlalchemy import select

    from fleetbench.warehouse.schema import regressions

    query = select(regressions).order_by(regressions.c.run_id, regressions.c.host, regressions.c.case_key, regressions.c.metric)
    if dag_id:
        query = query.where(regressions.c.dag_id == dag_id)
    if run_id:
        query = query.where(regressions.c.run_id == run_id)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
    for row in rows:
        row["baseline_window"] = json.loads(row["baseline_window"])
        row["changes"] = json.loads(row["changes"]) if row["changes"] else {}
        row["detected_at"] = _aware(row["detected_at"]).isoformat()
    return rows


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_side(text: str) -> tuple[str, Any]:
    """A compare side: ("date", date) for YYYY-MM-DD, else ("driver", the driver version string)."""
    text = text.strip()
    if not text:
        raise ValueError("empty: give a driver version (e.g. 535.104.05) or a date (YYYY-MM-DD)")
    if _DATE.match(text):
        try:
            return "date", date.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a date (YYYY-MM-DD)") from None
    return "driver", text


def _side_rows(conn, side: str, host: str | None, dag_id: str | None) -> list[dict]:
    from sqlalchemy import select

    from fleetbench.warehouse.schema import benchmark_results as br

    kind, value = parse_side(side)
    query = select(br).where(br.c.status == "ok")
    if kind == "date":
        start = datetime.combine(value, time(), tzinfo=timezone.utc)
        query = query.where(br.c.logical_date >= start, br.c.logical_date < start + timedelta(days=1))
        what = f"with a logical date on {value.isoformat()} (UTC)"
    else:
        query = query.where(br.c.driver_version == value)
        what = f"with driver version {value!r}"
    if host:
        query = query.where(br.c.host == host)
        what += f" on host {host!r}"
    if dag_id:
        query = query.where(br.c.dag_id == dag_id)
    rows = [dict(r._mapping) for r in conn.execute(query.order_by(br.c.logical_date.desc()))]
    if not rows:
        hint = ""
        if kind == "driver":
            known = sorted(v for v in conn.execute(select(br.c.driver_version).distinct()).scalars() if v)
            hint = f" (known driver versions: {', '.join(known) or 'none'})"
        raise NoResults(f"no ok results {what}{hint}")
    return rows


def _step_samples(conn, rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[float]]:
    from sqlalchemy import select, tuple_

    from fleetbench.warehouse.schema import steps

    keys = sorted({(r["dag_id"], r["run_id"], r["host"], r["case_key"]) for r in rows})
    out: dict[tuple[str, str], list[float]] = {}
    for i in range(0, len(keys), 500):  # bounded IN lists
        chunk = keys[i:i + 500]
        query = select(steps.c.host, steps.c.case_key, steps.c.images_per_sec).where(
            tuple_(steps.c.dag_id, steps.c.run_id, steps.c.host, steps.c.case_key).in_(chunk))
        for host, case_key, value in conn.execute(query):
            if value is not None:
                out.setdefault((host, case_key), []).append(value)
    return out


def compare(engine, before: str, after: str, host: str | None = None, dag_id: str | None = None,
            settings: RegressionSettings | None = None) -> list[dict]:
    """Before/after report per host and case (`compare_case`), for the hosts and cases both sides have.

    `before` / `after`: a driver version (matches `driver_version` exactly) or a date YYYY-MM-DD (the
    results whose logical date falls on that day, UTC). Raises `NoResults` when a side matches no ok
    result, `ValueError` for an impossible date.
    """
    settings = settings or RegressionSettings()
    with engine.connect() as conn:
        b_rows = _side_rows(conn, before, host, dag_id)
        a_rows = _side_rows(conn, after, host, dag_id)
        b_steps, a_steps = _step_samples(conn, b_rows), _step_samples(conn, a_rows)
    groups: dict[tuple[str, str], tuple[list, list]] = {}
    for r in b_rows:
        groups.setdefault((r["host"], r["case_key"]), ([], []))[0].append(r)
    for r in a_rows:
        groups.setdefault((r["host"], r["case_key"]), ([], []))[1].append(r)
    return [compare_case(b, a, settings, b_steps.get(key, []), a_steps.get(key, []))
            for key, (b, a) in sorted(groups.items()) if b and a]
