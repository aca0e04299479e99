"""`fleetbench compare`: per host and case (or per case, host against host), one side's nightly results against
the other's, along any dimension: driver, CUDA driver, image digest, host, a date or a date range.

The unit is the night (one ok result), never a step sample: step values are running means of one
night, and their p-values say nothing about nights. Per metric the change is the Hodges-Lehmann
estimate, the median of all pairwise differences after - before, as % of the before side's median,
with its distribution-free confidence interval (the Mann-Whitney one, Moses' method: the K-th
smallest and largest pairwise differences, K = n_b n_a / 2 - z_{1-alpha/2} sqrt(n_b n_a (n_b + n_a + 1) / 12)).

The verdict comes from the results' primary metric (benchmark_results `metric` and `value`: images/sec,
NCCL bus bandwidth, a team's own metric), in the direction its `better` names (wall time when the
sides share no primary metric); time, energy and cost are the same change seen through other metrics
and are shown, not counted again:

- "not enough nights to tell": fewer than `MIN_NIGHTS` nights on a side, or an interval that reaches
  both below and above the minimum effect (it cannot tell "no change" from a change);
- "regression" / "improvement": the whole interval is on one side of 0 and the estimate is at least
  `min_effect_pct`;
- "no change": the interval lies within +-`min_effect_pct` (an interval that excludes 0 but reaches past the
  minimum effect, e.g. a driver that is 20 % slower on some nights, is not "no change").

`compare_case` is pure; `compare` reads both sides from the warehouse; `format_compare` is the CLI's table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np

from fleetbench.config import RegressionSettings
from fleetbench.regression.detect import (
    ENERGY_SOURCES,
    SECONDARY,
    Row,
    mann_whitney_u,
    median,
    metric_value,
    most_common,
    primary_of,
    severity_of,
)

MIN_NIGHTS = 3  # fewer nights than this on a side: not enough nights to tell
ALPHA = 0.01  # the interval is 1 - ALPHA (99 %)


@dataclass(frozen=True)
class Shift:
    """after - before of one metric: Hodges-Lehmann estimate and interval, in % of the before side's median."""

    estimate_pct: float
    low_pct: float
    high_pct: float
    p_value: float | None


def hodges_lehmann(before: Sequence[float], after: Sequence[float], alpha: float = ALPHA) -> Shift | None:
    """The shift after - before and its 1 - alpha interval (module docstring), as % of median(before);
    None when a side has no value or the before side's median is not positive."""
    b = np.asarray([v for v in before if v is not None and math.isfinite(v)], dtype=float)
    a = np.asarray([v for v in after if v is not None and math.isfinite(v)], dtype=float)
    if len(b) == 0 or len(a) == 0:
        return None
    base = float(np.median(b))
    if base <= 0:
        return None
    diffs = np.sort((a[:, None] - b[None, :]).ravel())
    n = len(diffs)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    k = int(math.floor(n / 2.0 - z * math.sqrt(len(a) * len(b) * (len(a) + len(b) + 1) / 12.0)))
    low, high = (diffs[k], diffs[n - 1 - k]) if k >= 0 else (-math.inf, math.inf)
    mw = mann_whitney_u(a.tolist(), b.tolist())
    pct = 100.0 / base
    return Shift(float(np.median(diffs)) * pct, float(low) * pct, float(high) * pct, mw.p_value if mw else None)


def verdict_of(shift: Shift | None, n_before: int, n_after: int, direction: str,
               settings: RegressionSettings) -> str:
    if shift is None or n_before < MIN_NIGHTS or n_after < MIN_NIGHTS:
        return "not enough nights to tell"
    sign = 1.0 if direction == "higher" else -1.0  # good direction of after - before
    low, high = sorted((sign * shift.low_pct, sign * shift.high_pct))
    est = sign * shift.estimate_pct
    if high < 0 and -est >= settings.min_effect_pct:
        return "regression"
    if low > 0 and est >= settings.min_effect_pct:
        return "improvement"
    if low > -settings.min_effect_pct and high < settings.min_effect_pct:
        return "no change"
    return "not enough nights to tell"


def _values(rows: Sequence[Row], metric: str, source: str | None = None, unit: str | None = None) -> list[float]:
    """The rows' values of a metric (`detect.metric_value`: a primary metric in `unit`), energy of one source."""
    values = [(metric_value(r, metric, unit), r) for r in rows]
    return [v for v, r in values if v is not None and (source is None or r.get("energy_source") == source)]


def shared_primary(before: Sequence[Row], after: Sequence[Row]) -> tuple[str | None, str | None, str]:
    """(metric, unit, better) of the primary metric the sides compare on: the after side's most common one that
    the before side has too; (None, None, "higher") when they share none."""
    have = {primary_of(r)[:2] for r in before}
    for key in sorted({primary_of(r) for r in after},
                      key=lambda k: (-sum(primary_of(r) == k for r in after), str(k))):  # ties: by name, stable
        if key[0] and key[:2] in have:
            return key
    return None, None, "higher"


def compare_case(before: Sequence[Row], after: Sequence[Row], settings: RegressionSettings | None = None) -> dict:
    """One (host, case) (or case) before and after: nights per side, medians, the shift of each metric with its
    interval, and one verdict (module docstring)."""
    settings = settings or RegressionSettings()
    name, unit, better = shared_primary(before, after)
    shifts: dict[str, Shift | None] = {}
    for metric in SECONDARY:
        if metric == "energy_j":  # like with like: one common source, measured preferred
            source = next((s for s in ENERGY_SOURCES if _values(before, metric, s) and _values(after, metric, s)),
                          None)
            shifts[metric] = (hodges_lehmann(_values(before, metric, source), _values(after, metric, source))
                              if source else None)
        else:
            shifts[metric] = hodges_lehmann(_values(before, metric), _values(after, metric))
    b_vals, a_vals = (_values(before, name, unit=unit), _values(after, name, unit=unit)) if name else ([], [])
    main = hodges_lehmann(b_vals, a_vals)
    if main is None and not (b_vals and a_vals):  # no primary metric both sides have: wall time
        name, unit, better = "duration_s", "s", "lower"
        b_vals, a_vals, main = _values(before, name), _values(after, name), shifts[name]
    b_n, a_n = len(b_vals), len(a_vals)
    # A shared metric whose before median is 0 (failed requests 0 -> 250, a throughput that was 0) has no % change:
    # judged on its absolute shift instead of falling back to wall time, which hid it.
    verdict = (verdict_of(main, b_n, a_n, better, settings) if main is not None or not (b_vals and a_vals)
               else _from_zero(b_vals, a_vals, better))
    first = (after or before)[0]
    out = {
        "host": first["host"], "case_key": first["case_key"], "metric": name, "unit": unit, "direction": better,
        "before_n": b_n, "after_n": a_n,
        "before_value": median(b_vals) if b_vals else None,
        "after_value": median(a_vals) if a_vals else None,
        "delta_pct": main.estimate_pct if main else None,
        "delta_abs": (median(a_vals) - median(b_vals)) if main is None and b_vals and a_vals else None,
        "ci_low_pct": main.low_pct if main else None, "ci_high_pct": main.high_pct if main else None,
        "p_value": main.p_value if main else None, "basis": "nights", "verdict": verdict,
        "significant": verdict in ("regression", "improvement"),
        # graded by its % change; a metric that left 0 for the worse has none to grade: the top grade
        "severity": (None if verdict != "regression" else severity_of(abs(main.estimate_pct), settings) if main
                     else "major"),
        # What each side ran under (its most common value): driver, CUDA driver, the GPUs' health.
        **{f"{side}_{c}": most_common(r.get(c) for r in rows) for side, rows in (("before", before), ("after", after))
           for c in ("driver_version", "cuda_driver_version", "host_gpu_health")},
        # the base's digest, or (a baked image) what the bake put on it
        "image_changed": ({(r.get("image_digest"), r.get("bake_inputs")) for r in before}
                          != {(r.get("image_digest"), r.get("bake_inputs")) for r in after}),
    }
    for metric, label in (("duration_s", "duration"), ("energy_j", "energy"), ("cost_usd", "cost")):
        s = shifts[metric]
        out[f"{label}_delta_pct"] = s.estimate_pct if s else None
        out[f"{label}_ci_pct"] = [s.low_pct, s.high_pct] if s else None
    return out


def _from_zero(before: Sequence[float], after: Sequence[float], better: str) -> str:
    """The verdict on a metric whose before median is 0 (no % change): the direction of a change the rank test
    finds at the interval's level, with the nights the % verdict needs."""
    if len(before) < MIN_NIGHTS or len(after) < MIN_NIGHTS:
        return "not enough nights to tell"
    b, a = median(before), median(after)
    if a == b:
        return "no change"
    mw = mann_whitney_u(list(after), list(before))
    if mw is None or mw.p_value is None or mw.p_value >= ALPHA:
        return "not enough nights to tell"
    return "regression" if (a < b if better == "higher" else a > b) else "improvement"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


COMPARE_TABLE = ("host", "case", "metric", "before (nights)", "after (nights)", "change % [99 % interval]", "verdict",
                 "time %", "energy %", "cost %", "driver, GPU health")


def _ran_under(r: Mapping[str, Any]) -> str:
    """"550.127.05 -> 590.48.01, healthy -> degraded": what each side ran under, once where both sides agree."""
    parts = []
    for c in ("driver_version", "host_gpu_health"):
        b, a = r.get(f"before_{c}"), r.get(f"after_{c}")
        if b or a:
            parts.append(b if b == a else f"{b or '?'} -> {a or '?'}")
    return ", ".join(parts) or "-"


def format_compare(rows: Sequence[Mapping[str, Any]]) -> str:
    """The compare report as a text table (one line per host and case)."""
    cells = [list(COMPARE_TABLE)]
    several = len({r.get("dag_id") for r in rows}) > 1  # then the case names its DAG
    for r in rows:
        change = (f"{_num(r['delta_pct'], '+.1f')} [{_num(r['ci_low_pct'], '+.1f')}, {_num(r['ci_high_pct'], '+.1f')}]"
                  if r["delta_pct"] is not None else
                  f"{_num(r['delta_abs'], '+.4g')} (from 0: no %)" if r.get("delta_abs") is not None else "-")
        arrow = "" if r.get("direction") is None else " (higher better)" if r["direction"] == "higher" else (
            " (lower better)")
        cells.append([
            r["host"], f"{r['dag_id']}/{r['case_key']}" if several else r["case_key"],
            f"{r['metric']} {r.get('unit') or ''}".rstrip() + arrow,
            f"{_num(r['before_value'], '.4g')} ({r['before_n']})",
            f"{_num(r['after_value'], '.4g')} ({r['after_n']})",
            change, r["verdict"] + (f" ({r['severity']})" if r.get("severity") else ""),
            _num(r["duration_delta_pct"], "+.1f"), _num(r["energy_delta_pct"], "+.1f"),
            _num(r["cost_delta_pct"], "+.1f"), _ran_under(r),
        ])
    widths = [max(len(c[i]) for c in cells) for i in range(len(COMPARE_TABLE))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class NoResults(LookupError):
    """A compare side that matches no ok result (an unknown driver version or a date without runs)."""


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# KIND=VALUE: the column a side matches.
SIDE_COLUMNS = {"driver": "driver_version", "cuda": "cuda_driver_version", "digest": "image_digest", "host": "host"}
SIDE_KINDS = ", ".join([*SIDE_COLUMNS, "date"])


def _date(text: str) -> date:
    if not _DATE.match(text):
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD)")
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD)") from None
    if day == date.max:  # a side ends at the start of the day after its last day
        raise ValueError(f"{text!r} is out of range (the last day is 9999-12-30)")
    return day


def parse_side(text: str) -> tuple[str, Any]:
    """A compare side: KIND=VALUE with KIND one of driver, cuda, digest, host, date; a date is YYYY-MM-DD or
    YYYY-MM-DD..YYYY-MM-DD (both days included) and comes back as ("date", (first, last)). A bare date or
    range is a date side, any other bare text a driver version."""
    text = text.strip()
    if not text:
        raise ValueError("empty: give KIND=VALUE (kinds: " + SIDE_KINDS + "), a driver version or a date (YYYY-MM-DD)")
    kind, sep, value = text.partition("=")
    if not sep:
        kind, value = ("date" if _DATE.match(text.split("..")[0]) else "driver"), text
    kind, value = kind.strip().lower(), value.strip()
    if kind not in (*SIDE_COLUMNS, "date"):
        raise ValueError(f"{text!r}: unknown kind {kind!r} (kinds: {SIDE_KINDS})")
    if not value:
        raise ValueError(f"{text!r}: no value after {kind}=")
    if kind == "date":
        first, dots, last = value.partition("..")
        if dots and not last:
            raise ValueError(f"{text!r}: a range needs its last day too (YYYY-MM-DD..YYYY-MM-DD)")
        start, end = _date(first), _date(last) if last else _date(first)
        if end < start:
            raise ValueError(f"{text!r}: the range ends before it starts")
        return "date", (start, end)
    return kind, value


def _side_query(table, side: str, host: str | None, dag_id: str | None):
    from sqlalchemy import select

    kind, value = parse_side(side)
    query = select(table).where(table.c.status == "ok")
    if kind == "date":
        start = datetime.combine(value[0], time(), tzinfo=timezone.utc)
        end = datetime.combine(value[1], time(), tzinfo=timezone.utc) + timedelta(days=1)
        query = query.where(table.c.logical_date >= start, table.c.logical_date < end)
    else:
        query = query.where(table.c[SIDE_COLUMNS[kind]] == value)
    if host:  # with the multi-node cases whose set includes it
        from fleetbench.warehouse.read import on_host

        query = query.where(on_host(table, host))
    if dag_id:
        query = query.where(table.c.dag_id == dag_id)
    return query.order_by(table.c.logical_date.desc())


def _side_what(kind: str, value: Any) -> str:
    if kind == "date":
        return (f"with a logical date on {value[0].isoformat()}" if value[0] == value[1] else
                f"with a logical date from {value[0].isoformat()} to {value[1].isoformat()}") + " (UTC)"
    return f"with {SIDE_COLUMNS[kind]} {value!r}"


def _side_rows(conn, side: str, host: str | None, dag_id: str | None, attempts: bool = False) -> list[dict]:
    """The ok results of one side: current attempts, or with `attempts` superseded ones too, of which each
    (run, host, case) keeps its latest attempt on this side (`fleetbench.warehouse.attempts.current_attempt`)."""
    from sqlalchemy import select

    from fleetbench.warehouse.attempts import current_attempt
    from fleetbench.warehouse.schema import benchmark_results as br
    from fleetbench.warehouse.schema import superseded_results as sr

    kind, value = parse_side(side)
    rows = [dict(r._mapping) for r in conn.execute(_side_query(br, side, host, dag_id))]
    if attempts:
        by_key: dict[tuple, list[dict]] = {}
        for r in rows + [dict(r._mapping) for r in conn.execute(_side_query(sr, side, host, dag_id))]:
            by_key.setdefault((r["dag_id"], r["run_id"], r["host"], r["case_key"]), []).append(r)
        rows = [current_attempt(a) for a in by_key.values()]
    if not rows:
        what = _side_what(kind, value) + (f" on host {host!r}" if host else "") + (f" of DAG {dag_id!r}" if dag_id
                                                                                   else "")
        hint = ""
        if kind != "date":
            col = br.c[SIDE_COLUMNS[kind]]
            from fleetbench.warehouse.read import on_host

            # the host's own rows and its multi-node sets', as the side's own query reads them
            scope = [*([on_host(br, host)] if host else []), *([br.c.dag_id == dag_id] if dag_id else [])]
            known = sorted(v for v in conn.execute(select(col).where(*scope).distinct().limit(50)).scalars() if v)
            hint = f" (known: {', '.join(known) or 'none'})"
        if not attempts and conn.execute(_side_query(sr, side, host, dag_id).limit(1)).first() is not None:
            hint += "; superseded attempts have some: add --attempts"
        raise NoResults(f"no ok results {what}{hint}")
    return rows


def compare(engine, before: str, after: str, host: str | None = None, dag_id: str | None = None,
            settings: RegressionSettings | None = None, attempts: bool = False) -> list[dict]:
    """Before/after report (`compare_case`) per host and case both sides have; per case when the sides are
    hosts (host against host). `attempts`: superseded attempts count too (e.g. nights measured on the old
    driver and measured again on the new one by a backfill), each night once per side. A result that both sides
    match counts on the after side only (`before_also_after_n` per case says how many left the before side). Raises
    `NoResults` when a side matches no ok result (or the before side none that is not also after), `ValueError` for a
    side that cannot be read, or the same side twice."""
    settings = settings or RegressionSettings()
    kinds = parse_side(before)[0], parse_side(after)[0]
    if (kinds[0] == "host") != (kinds[1] == "host"):  # one host against a whole side would overlap it
        raise ValueError(f"--before {before} with --after {after}: a host= side compares with another host= side only "
                         "(host against host); to compare one host's nights, give --host and a driver, date, cuda or "
                         "digest on both sides")
    if parse_side(before) == parse_side(after):
        raise ValueError(f"--before {before} and --after {after} are the same side: its nights would be compared with "
                         "themselves")
    by_host = kinds[0] != "host"
    with engine.connect() as conn:
        b_rows = _side_rows(conn, before, host, dag_id, attempts)
        a_rows = _side_rows(conn, after, host, dag_id, attempts)
    # A result both sides match (a date range that holds the other side's nights, a date range against a driver, a
    # multi-node case of both hosts) counts on the after side only: in both samples it would pull them together.
    on_after = {_attempt_key(r) for r in a_rows}
    kept = [r for r in b_rows if _attempt_key(r) not in on_after]
    if not kept:
        raise NoResults(f"every ok result of --before {before} also matches --after {after} ({len(b_rows)} result(s)): "
                        "give a before side that does not hold the after side's nights")
    # per DAG too: two DAGs benchmarking one host are two setups (and share their run ids and nights)
    groups: dict[tuple[str, str, str], tuple[list, list, list]] = {}
    for side, rows in ((0, kept), (1, a_rows), (2, [r for r in b_rows if _attempt_key(r) in on_after])):
        for r in rows:
            key = (r["dag_id"], r["host"] if by_host else "", r["case_key"])
            groups.setdefault(key, ([], [], []))[side].append(r)
    out = []
    for key, (b, a, shared) in sorted(groups.items()):
        if b and a:
            row = {**compare_case(b, a, settings), "dag_id": key[0], "before_also_after_n": len(shared)}
            if not by_host:
                row["host"] = f"{b[0]['host']} -> {a[0]['host']}"
            out.append(row)
    return out


def _attempt_key(row: dict) -> tuple:
    """One stored result: its run, host, case and attempt (a backfill's new attempt of a night is another result)."""
    return row["dag_id"], row["run_id"], row["host"], row["case_key"], row.get("attempt")
