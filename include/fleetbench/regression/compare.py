"""The before/after report: per host and case, the results of one side (a driver version or a date) against the other's.

`compare_case` is pure; `compare` reads both sides from the warehouse; `format_compare` is the CLI's table.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime, time, timedelta, timezone
from typing import Any, Mapping, Sequence

from fleetbench.config import RegressionSettings
from fleetbench.regression.detect import (
    ENERGY_SOURCES,
    Row,
    check_metric,
    delta_pct,
    mann_whitney_u,
    median,
    most_common,
    severity_of,
)


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


COMPARE_TABLE = ("host", "case", "before img/s (n)", "after img/s (n)", "delta %", "z", "p", "verdict", "energy %",
                 "cost %")


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


class NoResults(LookupError):
    """A compare side that matches no ok result (an unknown driver version or a date without runs)."""


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


def _side_query(table, side: str, host: str | None, dag_id: str | None):
    from sqlalchemy import select

    kind, value = parse_side(side)
    query = select(table).where(table.c.status == "ok")
    if kind == "date":
        start = datetime.combine(value, time(), tzinfo=timezone.utc)
        query = query.where(table.c.logical_date >= start, table.c.logical_date < start + timedelta(days=1))
    else:
        query = query.where(table.c.driver_version == value)
    if host:
        query = query.where(table.c.host == host)
    if dag_id:
        query = query.where(table.c.dag_id == dag_id)
    return query.order_by(table.c.logical_date.desc())


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
        what = (f"with a logical date on {value.isoformat()} (UTC)" if kind == "date"
                else f"with driver version {value!r}") + (f" on host {host!r}" if host else "")
        hint = ""
        if kind == "driver":
            known = sorted(v for v in conn.execute(select(br.c.driver_version).distinct()).scalars() if v)
            hint = f" (known driver versions: {', '.join(known) or 'none'})"
        if not attempts and conn.execute(_side_query(sr, side, host, dag_id).limit(1)).first() is not None:
            hint += "; superseded attempts have some: add --attempts"
        raise NoResults(f"no ok results {what}{hint}")
    return rows


def _step_samples(conn, rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[float]]:
    from sqlalchemy import select, tuple_

    from fleetbench.warehouse.schema import steps

    out: dict[tuple[str, str], list[float]] = {}
    for r in rows:  # a superseded attempt carries its own steps
        if r.get("steps_json"):
            out.setdefault((r["host"], r["case_key"]), []).extend(
                s["images_per_sec"] for s in json.loads(r["steps_json"]) if s.get("images_per_sec") is not None)
    keys = sorted({(r["dag_id"], r["run_id"], r["host"], r["case_key"]) for r in rows if "steps_json" not in r})
    for i in range(0, len(keys), 500):  # bounded IN lists
        chunk = keys[i:i + 500]
        query = select(steps.c.host, steps.c.case_key, steps.c.images_per_sec).where(
            tuple_(steps.c.dag_id, steps.c.run_id, steps.c.host, steps.c.case_key).in_(chunk))
        for host, case_key, value in conn.execute(query):
            if value is not None:
                out.setdefault((host, case_key), []).append(value)
    return out


def compare(engine, before: str, after: str, host: str | None = None, dag_id: str | None = None,
            settings: RegressionSettings | None = None, attempts: bool = False) -> list[dict]:
    """Before/after report per host and case (`compare_case`), for the hosts and cases both sides have.

    `before` / `after`: a driver version (matches `driver_version` exactly) or a date YYYY-MM-DD (the
    results whose logical date falls on that day, UTC). `attempts`: superseded attempts count too
    (e.g. nights measured on the old driver and measured again on the new one by a backfill), each
    night once per side. Raises `NoResults` when a side matches no ok result, `ValueError` for an
    impossible date.
    """
    settings = settings or RegressionSettings()
    with engine.connect() as conn:
        b_rows = _side_rows(conn, before, host, dag_id, attempts)
        a_rows = _side_rows(conn, after, host, dag_id, attempts)
        b_steps, a_steps = _step_samples(conn, b_rows), _step_samples(conn, a_rows)
    groups: dict[tuple[str, str], tuple[list, list]] = {}
    for r in b_rows:
        groups.setdefault((r["host"], r["case_key"]), ([], []))[0].append(r)
    for r in a_rows:
        groups.setdefault((r["host"], r["case_key"]), ([], []))[1].append(r)
    return [compare_case(b, a, settings, b_steps.get(key, []), a_steps.get(key, []))
            for key, (b, a) in sorted(groups.items()) if b and a]
